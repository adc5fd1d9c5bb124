#!/usr/bin/env bash
# Everything the README's commands and the test suite need, installed the one way both the README and .ci/run use:
# torch, advbench with its test extra, the reference packages some tests compare with, RobustBench beside them, and a
# headless browser where one can be had. Run it from any folder, in the Python environment to install into.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu takes PyTorch's CPU-only wheels (a fraction of the CUDA builds' size).
set -euo pipefail
cd "$(dirname "$0")/.."

pip_install() { python -m pip install --quiet "$@"; }

if [ -n "${TORCH_INDEX:-}" ]; then
  pip_install torch==2.14.1 torchvision==0.29.1 --index-url "$TORCH_INDEX"
else
  pip_install torch==2.14.1 torchvision==0.29.1
fi
pip_install -e '.[test]'

# metric=niqe's reference parameters and tests/test_niqe_reference.py's MATLAB-faithful NIQE come from basicsr, read by
# file path: none of its dependencies (OpenCV, tb-nightly, LMDB) is needed. Its sdist imports torch to build, hence no
# build isolation, and setuptools + wheel in the environment to build it with.
pip_install setuptools wheel
pip_install --no-deps --no-build-isolation basicsr==1.4.2
# tests/test_pyiqa_backend.py checks metric=pyiqa against the real IQA-PyTorch (PolyForm Noncommercial: used here to
# test, not shipped). Only what `import pyiqa` and its networks need: its other dependencies (transformers,
# bitsandbytes, ...) are heavy.
pip_install --no-deps pyiqa==0.1.16 opencv-python-headless
pip_install huggingface_hub

# RobustBench 1.1.1 beside the environment, in .robustbench-site: torchattacks 3.5.1 (test extra) bundles an old copy
# of RobustBench's package, whose files the real one's would overwrite in one site-packages. tests/test_robustbench.py
# runs what needs the real package with this folder first on PYTHONPATH. Only the modules `import robustbench.utils`
# needs that the test extra lacks; pyautoattack comes with the test extra.
rm -rf .robustbench-site
pip_install --no-deps --target .robustbench-site robustbench==1.1.1 timm==1.0.9 gdown==5.1.0 geotorch==0.4.0 \
  torchdiffeq==0.2.5 beautifulsoup4==4.15.0 soupsieve==4.1.4

# tests/test_report_page.py renders report.html in headless Chromium; where none can be installed it skips, saying so.
browser_found() { command -v chromium || command -v chromium-browser || command -v google-chrome; } >/dev/null
if ! browser_found; then
  as_root=()
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then as_root=(sudo -n); fi
  if command -v apt-get >/dev/null && { [ "$(id -u)" -eq 0 ] || [ ${#as_root[@]} -gt 0 ]; }; then
    apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
    { "${apt[@]}" update -qq && { "${apt[@]}" install -y -qq chromium || "${apt[@]}" install -y -qq chromium-browser; }; } \
      >/dev/null 2>&1 || true
  fi
  browser_found || echo "setup: no browser could be installed (chromium); tests/test_report_page.py will skip"
fi
