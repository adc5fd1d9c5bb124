"""scripts/setup.sh is the one set-up: `.ci/run` and the README's set-up command both run it and install
nothing else, and its browser step never fails the set-up: where no browser can be installed it says so
in one line (tests/test_report_page.py then skips, saying why)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
INSTALLS = re.compile(r"\b(pip|pip3|apt-get|apt|conda|uv)\b[^\n]*\binstall\b|\bensurepip\b")


def _code(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_ci_installs_only_through_the_setup_script() -> None:
    code = _code(ROOT / ".ci" / "run")
    assert "bash scripts/setup.sh" in code
    assert [line for line in code if INSTALLS.search(line)] == []


def test_the_readme_sets_up_with_the_same_script() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Set up and run", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert block.strip().startswith("bash scripts/setup.sh && ")
    assert not INSTALLS.search(block), block


def test_the_script_stops_on_errors_and_runs_from_any_folder() -> None:
    code = _code(SETUP)
    assert code[0] == "set -euo pipefail" and code[1] == 'cd "$(dirname "$0")/.."'


def _browser_step(tmp_path: Path, apt_get: str) -> subprocess.CompletedProcess:
    """The script's browser step alone, with only `id`, `env` and a stub apt-get on PATH (as root, like CI)."""
    text = SETUP.read_text(encoding="utf-8")
    step = text[text.index("browser_found()"):]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\n{apt_get}\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    (bin_dir / "env").symlink_to("/usr/bin/env")
    return subprocess.run(["/bin/bash", "-euo", "pipefail", "-c", step], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": str(bin_dir)})


def test_no_browser_to_be_had_is_one_line_and_not_a_failure(tmp_path: Path) -> None:
    proc = _browser_step(tmp_path, "echo 'E: Unable to locate package chromium' >&2; exit 100")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["setup: no browser could be installed (chromium); tests/test_report_page.py will skip"]
    assert proc.stderr == ""


def test_a_browser_apt_installs_is_taken_without_a_word(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install = (f'[ "$1" = install ] && printf "#!/bin/sh\\n" > {bin_dir}/chromium && /bin/chmod +x {bin_dir}/chromium; exit 0')
    proc = _browser_step(tmp_path, install)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    assert (bin_dir / "chromium").is_file()
