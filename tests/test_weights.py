"""`advbench weights`: fetching published weights from a loopback server, resuming, verifying."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from advbench.cli.main import main
from advbench.quality.metrics.registry import build_metric


@dataclass
class Served:
    """What the loopback server holds and what it saw."""

    files: dict[str, bytes] = field(default_factory=dict)
    cut_after: int | None = None  # close the first response after this many bytes
    ranges: list[str | None] = field(default_factory=list)


def _handler(state: Served) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = state.files.get(self.path.lstrip("/"))
            if body is None:
                self.send_error(404)
                return
            asked = self.headers.get("Range")
            state.ranges.append(asked)
            start = int(asked.removeprefix("bytes=").rstrip("-")) if asked else 0
            self.send_response(206 if asked else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            if state.cut_after is not None:
                self.wfile.write(body[start:start + state.cut_after])
                state.cut_after = None
                self.close_connection = True
                return
            self.wfile.write(body[start:])

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    state = Served()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def weights_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "weights"
    monkeypatch.setenv("ADVBENCH_WEIGHTS", str(folder))
    return folder


def _nima_checkpoint() -> tuple[bytes, torch.Tensor]:
    """A randomly initialised NIMA saved as the authors publish it (a bare state dict)."""
    torch.manual_seed(0)
    with pytest.warns(UserWarning):
        net = build_metric("nima", weights=None).net
    for p in net.parameters():
        p.data.normal_(0, 0.05)
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    return buffer.getvalue(), next(iter(net.state_dict().values())).clone()


def _fetch(*args: str) -> object:
    return CliRunner().invoke(main, ["weights", "fetch", *args])


def test_fetch_downloads_verifies_and_installs_where_the_metric_config_looks(server, weights_dir):
    url, state = server
    body, first_tensor = _nima_checkpoint()
    state.files["pretrain-model.pth"] = body
    result = _fetch("nima", "--mirror", url)
    assert result.exit_code == 0, result.output
    target = weights_dir / "nima.pth"
    assert target.read_bytes() == body
    assert not (weights_dir / "nima.pth.part").exists()
    metric = build_metric("nima")  # the shipped config now finds the file and loads it
    assert metric.pretrained
    assert torch.equal(next(iter(metric.net.state_dict().values())), first_tensor)
    listed = CliRunner().invoke(main, ["weights", "list"], env={"COLUMNS": "250"})
    nima_row = next(line for line in listed.output.splitlines() if line.strip("│ ").startswith("nima"))
    assert "yes" in nima_row


def test_an_interrupted_download_resumes_from_where_it_stopped(server, weights_dir):
    url, state = server
    body, _ = _nima_checkpoint()
    state.files["pretrain-model.pth"] = body
    state.cut_after = len(body) // 3
    first = _fetch("nima", "--mirror", url)
    assert first.exit_code == 1
    message = first.output.strip().splitlines()
    assert len(message) == 1 and "run the same command again to resume" in message[0]
    part = weights_dir / "nima.pth.part"
    assert part.stat().st_size == len(body) // 3
    assert not (weights_dir / "nima.pth").exists()

    second = _fetch("nima", "--mirror", url)
    assert second.exit_code == 0, second.output
    assert state.ranges == [None, f"bytes={len(body) // 3}-"]
    assert (weights_dir / "nima.pth").read_bytes() == body


def test_a_file_that_does_not_fit_the_architecture_is_refused_and_deleted(server, weights_dir):
    url, state = server
    buffer = io.BytesIO()
    torch.save({"features.0.weight": torch.zeros(3)}, buffer)
    state.files["pretrain-model.pth"] = buffer.getvalue()
    result = _fetch("nima", "--mirror", url)
    assert result.exit_code == 1
    assert "does not fit the architecture" in result.output and "Traceback" not in result.output
    assert not any(weights_dir.iterdir())


def test_torchvision_files_are_checked_against_the_hash_in_their_name(server, weights_dir):
    url, state = server
    state.files["resnet50-0676ba61.pth"] = b"not the published file"
    assert not hashlib.sha256(b"not the published file").hexdigest().startswith("0676ba61")
    result = _fetch("resnet50", "--mirror", url)
    assert result.exit_code == 1
    assert "SHA-256 does not start with 0676ba61" in result.output
    assert not any(weights_dir.iterdir())


def test_offline_web_page_and_unknown_names_end_in_one_line(weights_dir):
    closed = "http://127.0.0.1:9"  # discard port: nothing listens
    for args, expected in [
        (("nima", "--mirror", closed), "cannot reach 127.0.0.1:9"),
        (("spaq",), "download it there and save it as"),
        (("nimaa",), "unknown weights 'nimaa'; valid: paq2piq"),
    ]:
        result = _fetch(*args)
        assert result.exit_code == 1, args
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.output


def test_a_present_file_is_kept_unless_forced(server, weights_dir):
    url, state = server
    body, _ = _nima_checkpoint()
    state.files["pretrain-model.pth"] = body
    assert _fetch("nima", "--mirror", url).exit_code == 0
    assert _fetch("nima", "--mirror", url).exit_code == 0
    assert state.ranges == [None]
    assert _fetch("nima", "--mirror", url, "--force").exit_code == 0
    assert state.ranges == [None, None]
