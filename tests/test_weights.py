"""`advbench weights`: fetching published weights from a loopback server, resuming, verifying."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import importlib.metadata
import importlib.util
import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from advbench.cli.main import main
from advbench.cli.metrics import build_metric
from advbench.quality.metrics.published import PUBLISHED


@dataclass
class Served:
    """What the loopback server holds and what it saw."""

    files: dict[str, bytes] = field(default_factory=dict)
    cut_after: int | None = None  # close the first response after this many bytes
    ranges: list[str | None] = field(default_factory=list)
    endless: bool = False  # no Content-Length, bytes for ever
    trickle_s: float | None = None  # one byte every trickle_s seconds
    redirect: str | None = None  # answer every request with a 302 to this URL


def _handler(state: Served) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self._hostile():
                return
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

        def _hostile(self) -> bool:
            """The abuses of a hostile server; True when one answered the request."""
            if state.redirect is not None:
                self.send_response(302)
                self.send_header("Location", state.redirect)
                self.end_headers()
                return True
            if not (state.endless or state.trickle_s):
                return False
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"\0" * (1 if state.trickle_s else 1 << 16))
                    self.wfile.flush()
                    if state.trickle_s:
                        time.sleep(state.trickle_s)
            except (BrokenPipeError, ConnectionResetError):
                return True

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    """A client hanging up on a hostile answer is the point of the test, not an error to print."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    state = Served()
    httpd = _QuietServer(("127.0.0.1", 0), _handler(state))
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


# ---- a server that does not play fair --------------------------------------------------------


def _one_line(result: object, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_an_endless_stream_stops_at_the_size_cap_and_leaves_nothing(server, weights_dir, monkeypatch):
    from advbench.core import download

    url, state = server
    state.endless = True
    monkeypatch.setattr(download, "MAX_DOWNLOAD_BYTES", 3 << 20)
    _one_line(_fetch("nima", "--mirror", url), "sent more than the 3.1 MB this file may have", "partial file deleted")
    assert not any(weights_dir.iterdir())


def test_an_announced_oversize_is_refused_before_reading(server, weights_dir, monkeypatch):
    from advbench.core import download

    url, state = server
    state.files["pretrain-model.pth"] = b"x" * (2 << 20)
    monkeypatch.setattr(download, "MAX_DOWNLOAD_BYTES", 1 << 20)
    _one_line(_fetch("nima", "--mirror", url), "announces 2.1 MB, more than the 1.0 MB")


def test_a_trickle_stops_at_the_stall_rule(server, weights_dir, monkeypatch):
    from advbench.core import download

    url, state = server
    state.trickle_s = 0.05
    monkeypatch.setattr(download, "STALL_SECONDS", 0.6)
    tic = time.monotonic()
    _one_line(_fetch("nima", "--mirror", url), "stalled", "partial file deleted")
    assert time.monotonic() - tic < 10
    assert not (weights_dir / "nima.pth.part").exists()


def test_a_redirect_to_another_host_is_refused(server, weights_dir):
    url, state = server
    state.redirect = "http://elsewhere.invalid/pretrain-model.pth"
    _one_line(_fetch("nima", "--mirror", url), "redirected to elsewhere.invalid", "not among the publisher's hosts")
    assert not (weights_dir / "nima.pth").exists()


def test_a_redirect_loop_ends_in_one_line_at_once(server, weights_dir):
    url, state = server
    state.redirect = f"{url}/pretrain-model.pth"
    tic = time.monotonic()
    _one_line(_fetch("nima", "--mirror", url), "redirect")
    assert time.monotonic() - tic < 10


def test_a_symlinked_partial_file_is_refused_and_its_target_untouched(server, weights_dir, tmp_path):
    url, state = server
    body, _ = _nima_checkpoint()
    state.files["pretrain-model.pth"] = body
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"123456789")
    weights_dir.mkdir(parents=True)
    (weights_dir / "nima.pth.part").symlink_to(outside)
    _one_line(_fetch("nima", "--mirror", url), "is a symbolic link")
    assert outside.read_bytes() == b"123456789"


def test_a_mirror_that_is_not_a_url_is_one_line(weights_dir):
    _one_line(_fetch("nima", "--mirror", "not a url"), "--mirror must be an http:// or https:// URL")


def test_the_lock_file_says_how_each_file_was_checked(server, weights_dir):
    """A fetched file is locked with its SHA-256; `weights list` shows what was verified and flags a changed file."""
    from advbench.cli.weights import LOCK_FILE

    url, state = server
    body, _ = _nima_checkpoint()
    state.files["pretrain-model.pth"] = body
    assert _fetch("nima", "--mirror", url).exit_code == 0
    lock = json.loads((weights_dir / LOCK_FILE).read_text())
    assert lock["nima"]["sha256"] == hashlib.sha256(body).hexdigest()
    assert lock["nima"]["checked"] == "keys and shapes only", "NIMA's authors publish no checksum"

    def nima_row() -> str:
        listed = CliRunner().invoke(main, ["weights", "list"], env={"COLUMNS": "250"})
        return next(line for line in listed.output.splitlines() if line.strip("│ ").startswith("nima"))

    assert "keys and shapes only" in nima_row()
    (weights_dir / "nima.pth").write_bytes(body + b"\0")
    assert "not checked" in nima_row()


def test_torchvision_entries_match_torchvision_s_own_table() -> None:
    """The catalogue writes torchvision's URLs and sizes out (listing imports no torch); they must be its own."""
    from torchvision import models

    from advbench.cli.weights import TORCHVISION

    for arch, (url, size_mb) in TORCHVISION.items():
        published = models.get_model_weights(arch).IMAGENET1K_V1
        assert (url, size_mb) == (published.url, published.meta["_file_size"]), arch


def test_the_list_is_each_metric_s_declared_file_then_torchvision_s(weights_dir) -> None:
    """`advbench weights list` shows the metrics' declarations (`quality.metrics.published`), then torchvision's
    files, each with its source, where to get it and where it goes."""
    from advbench.cli.weights import TORCHVISION

    listed = CliRunner().invoke(main, ["weights", "list"])  # not a terminal: one block per file
    assert listed.exit_code == 0, listed.output
    assert [line.split()[0] for line in listed.output.splitlines() if "  present: " in line] == [*PUBLISHED, *TORCHVISION]
    for name, published in PUBLISHED.items():
        how = published.url if published.direct else f"{published.url} (web page: download by hand)"
        block = ("\n" + listed.output).split(f"\n{name}  present: ", 1)[1]
        assert block.splitlines()[2:4] == [f"  source: {published.source}", f"          {how}"], name
    assert f"  file:   {weights_dir / 'niqe_pris_params.npz'}" in listed.output.splitlines()
    assert f"  file:   {weights_dir / 'resnet50-0676ba61.pth'}" in listed.output.splitlines()


def _niqe_parameters() -> bytes:
    """NIQE's pristine parameters in basicsr's format (keys and shapes of its niqe_pris_params.npz), seeded."""
    g = torch.Generator().manual_seed(0)
    factor = torch.randn(36, 36, generator=g, dtype=torch.float64)
    buffer = io.BytesIO()
    np.savez(buffer, mu_pris_param=torch.randn(1, 36, generator=g, dtype=torch.float64).numpy(),
             cov_pris_param=(factor @ factor.T + torch.eye(36, dtype=torch.float64)).numpy())
    return buffer.getvalue()


def _pin_niqe(monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    """NIQE's entry pinned to `body`'s SHA-256 instead of basicsr's file, for a loopback server to serve."""
    monkeypatch.setitem(PUBLISHED, "niqe", dataclasses.replace(PUBLISHED["niqe"], sha256=hashlib.sha256(body).hexdigest()))


def test_fetch_niqe_installs_the_pinned_parameters_where_metric_niqe_reads_them(server, weights_dir, monkeypatch):
    """The file must have the pinned SHA-256 (another is refused and deleted) and read as a pristine model;
    then `metric=niqe` takes its parameters from it."""
    from advbench.cli import weights
    from advbench.quality.metrics.niqe import NIQE

    url, state = server
    body = _niqe_parameters()
    state.files["niqe_pris_params.npz"] = body
    refused = _fetch("niqe", "--mirror", url)
    assert refused.exit_code == 1 and f"SHA-256 is not the pinned {PUBLISHED['niqe'].sha256}" in refused.output
    assert not any(weights_dir.iterdir())

    _pin_niqe(monkeypatch, body)
    result = _fetch("niqe", "--mirror", url)
    assert result.exit_code == 0, result.output
    target = weights_dir / "niqe_pris_params.npz"
    assert result.output.strip() == f"niqe: {target}" and target.read_bytes() == body
    assert json.loads((weights_dir / weights.LOCK_FILE).read_text())["niqe"]["checked"] == "sha256 (pinned)"
    with np.load(io.BytesIO(body)) as served:
        assert np.array_equal(NIQE().mu.numpy(), served["mu_pris_param"].flatten())


def test_fetch_niqe_refuses_a_file_that_is_no_pristine_model(server, weights_dir, monkeypatch):
    url, state = server
    buffer = io.BytesIO()
    np.savez(buffer, mu_pris_param=np.zeros(5))
    state.files["niqe_pris_params.npz"] = buffer.getvalue()
    _pin_niqe(monkeypatch, buffer.getvalue())
    result = _fetch("niqe", "--mirror", url)
    _one_line(result, "niqe: the downloaded file does not fit the architecture (niqe:")
    assert "is not a pristine model" in result.output and not any(weights_dir.iterdir())


def test_the_niqe_entry_is_basicsr_1_4_2_s_file() -> None:
    """The pin is the sha256 of the file basicsr 1.4.2 installs, where it is installed here."""
    from advbench.cli.weights import sha256_of
    from advbench.quality.metrics.niqe_pristine import BASICSR_FILE

    spec = importlib.util.find_spec("basicsr")
    if spec is None:
        pytest.skip("basicsr is not installed (scripts/setup.sh installs it)")
    installed = Path(next(iter(spec.submodule_search_locations))) / BASICSR_FILE
    assert importlib.metadata.version("basicsr") == "1.4.2" and "/v1.4.2/basicsr/" + BASICSR_FILE in PUBLISHED["niqe"].url
    assert sha256_of(installed) == PUBLISHED["niqe"].sha256
