"""`advbench report` end to end: parts on disk, the command, report.json's card, and report.html
rendered by a real browser (headless Chromium): no console message, every figure an image
that decodes, the tables there, a screenshot taken."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest
from audit_records import INF, cell, records
from click.testing import CliRunner

import advbench
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError
from advbench.core.records import write_part

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DATA_PNG = re.compile(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)")
IMAGE_PROBE = ('<script>window.addEventListener("load",()=>{for(const i of document.images)'
               'console.log("advbench-img",i.naturalWidth,i.complete)})</script></body>')


def _runs(path: str) -> bool:
    """Whether the browser starts: Ubuntu's `chromium-browser` package is a stub that needs snap."""
    try:
        return subprocess.run([path, "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def browser() -> str:
    found = next((path for path in map(shutil.which, BROWSERS) if path and _runs(path)), None)
    if found is None:
        pytest.skip(f"no headless browser that runs (looked for {', '.join(BROWSERS)}); bash scripts/setup.sh installs "
                    "chromium where it can, and says so where it cannot")
    return found


def test_without_a_browser_that_runs_the_page_tests_skip_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stub = tmp_path / "chromium"
    stub.write_text("#!/bin/sh\necho 'requires the chromium snap' >&2\nexit 1\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="no headless browser that runs .*scripts/setup.sh installs chromium"):
        browser()


def render(page: Path, profile: Path, *flags: str) -> tuple[str, list[str]]:
    """The DOM Chromium builds from `page` and the console messages it logged."""
    done = subprocess.run([browser(), "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}",
                           "--enable-logging=stderr", *flags, page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    return done.stdout, CONSOLE.findall(done.stderr)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Records of two model rows on disk (one with signs), and the report the command writes from them."""
    root = tmp_path_factory.mktemp("report")
    frame = records(cell("bim", [0.05, 0.1, 0.15, 0.3]), cell("fgsm", [0.1, 0.15, 0.3, 0.4], strength=1),
                    cell("square", [0.1, 0.1, 0.2, 0.35], knowledge="score", strength=500),
                    cell("bim", [0.3, 0.3, 0.1, 0.3], defense="jpeg", grad_mode="bpda", flag_zero_grad=True),
                    cell("square", [0.1, 0.1, 0.3, INF], knowledge="score", strength=500, defense="jpeg"))
    for key, part in frame.groupby("cell_key"):
        write_part(part.assign(cell_samples=len(part)), root / "records" / f"digits_x_s0_{key}.parquet")
    result = CliRunner().invoke(main, ["report", str(root / "records"), "--out", str(root / "out")])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    return root / "out"


def test_the_card_holds_identity_attacks_versions_results_and_signs(report_dir: Path) -> None:
    text = (report_dir / "report.json").read_text(encoding="utf-8")
    report = json.loads(text, parse_constant=lambda c: pytest.fail(f"report.json holds {c}, which JSON has not"))
    board, = report["leaderboard"].values()
    assert [(r["rank"], r["row"]) for r in board] == [(1, "natural"), (None, "jpeg")]  # jpeg: flagged, unranked
    jpeg = next(m for m in report["models"] if m["row"] == "jpeg")
    assert jpeg["identity"]["model_sha256"] == "f" * 64 and jpeg["identity"]["weights"] == {"cache_key": "abc"}
    assert jpeg["environment"]["torch_version"] == "2.x" and jpeg["environment"]["device"] == "cpu"
    assert jpeg["data"]["n_samples"] == 4
    threat, = jpeg["threats"]
    assert {a["name"]: a["params"] for a in threat["attacks"]} == {"bim": {"steps": 20}, "square": {"steps": 500}}
    assert threat["worst_case"]["set_by"] == {"bim": 2, "square": 2}  # each broke the samples the other missed
    assert threat["worst_case"]["per_sample"]["set_by"] == ["square", "square", "bim", "bim"]
    assert threat["worst_case"]["per_sample"]["sample_id"] == [100, 101, 102, 103]
    assert {s["code"]: s["level"] for s in jpeg["signs"]} == {"black_box_beats_white_box": "failure",
                                                              "worst_far_below_best": "weak_attack",
                                                              "zero_gradients": "remedied"}
    natural = next(m for m in report["models"] if m["row"] == "natural")
    assert natural["signs"] == [] and natural["failures"] == 0
    assert natural["threats"][0]["worst_case"]["robust_at_budget"] == pytest.approx(0.25, rel=1e-12)


def test_the_api_writes_the_same_report(report_dir: Path, tmp_path: Path) -> None:
    written = advbench.report(report_dir.parent / "records", tmp_path)
    assert [p.name for p in written] == ["report.json", "report.html"]
    ours, theirs = (json.loads((d / "report.json").read_text()) for d in (tmp_path, report_dir))
    assert ours["models"] == theirs["models"]


def test_the_page_renders_in_a_browser_without_console_messages(report_dir: Path, tmp_path: Path) -> None:
    page = report_dir / "report.html"
    html = page.read_text(encoding="utf-8")
    assert "http://" not in html and "https://" not in html, "the page must not reach the network"
    dom, console = render(page, tmp_path / "profile", "--dump-dom")
    assert console == []
    assert dom.count("<table") >= 2 * 3 + 1  # the leaderboard, and per model: setters, optimality, card
    figures = DATA_PNG.findall(dom)
    assert len(figures) == 2  # one per model row and threat
    for data in figures:
        image = matplotlib.image.imread(io.BytesIO(base64.b64decode(data, validate=True)), format="png")
        assert image.shape[0] > 100 and image.shape[1] > 100
    assert "Not trustworthy" in dom and "A score-based, decision-based or transfer attack beats" in dom


def test_the_browser_decodes_every_figure_and_takes_a_screenshot(report_dir: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe.html"
    probe.write_text((report_dir / "report.html").read_text(encoding="utf-8").replace("</body>", IMAGE_PROBE))
    _, console = render(probe, tmp_path / "profile", "--dump-dom")
    widths = [re.search(r"advbench-img (\d+) (\w+)", m).groups() for m in console if "advbench-img" in m]
    assert len(widths) == 2 and all(int(w) > 100 and done == "true" for w, done in widths), console
    shot = tmp_path / "report.png"
    render(report_dir / "report.html", tmp_path / "profile2", f"--screenshot={shot}", "--window-size=1200,2400")
    assert matplotlib.image.imread(shot).shape[:2] == (2400, 1200)


def test_the_console_check_catches_a_message(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text('<html><body><script>console.error("broken")</script></body></html>')
    assert any("broken" in m for m in render(page, tmp_path / "profile", "--dump-dom")[1])


def test_bad_input_is_one_line_on_the_command_line_and_in_the_api(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and result.output.startswith("Error: no records at") and "Traceback" not in result.output
    with pytest.raises(AdvbenchError, match="records must be a DataFrame of benchmark records .* got columns .*min_eps_lo"):
        advbench.report(records(cell("bim", [0.1, 0.2])).drop(columns="min_eps"), tmp_path / "out")
