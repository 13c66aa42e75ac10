#!/usr/bin/env bash
# Sets up both environments and runs every test: the main suite in .venv, the RKNN tests in .venv-rknn
# (rknn-toolkit2 and its x86 simulator pin old numpy/onnx/protobuf, so they live apart).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
bash scripts/setup-rknn-env.sh
# The web page's browser test drives Debian's chromium through Debian's chromedriver: apt installs them, nothing
# else downloads a browser.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
  else
    echo "warning: chromium or chromium-driver missing and not root: tests/server/test_page.py will fail" >&2
  fi
fi
# One thread for torch and ONNX Runtime, here and in every process a test starts (threads auto reads it): the tiny
# models gain nothing from more, and two threads spinning on a shared 2-core machine made some tests 5-20x slower.
# The tests of thread counts set their own.
export OMP_NUM_THREADS=1
.venv/bin/python -m pytest -q "$@"
.venv-rknn/bin/python -m pytest -q tests/export/test_rknn.py tests/engine/test_rknn_backend.py tests/engine/test_rknn_timings.py tests/engine/test_memory_plan.py tests/cli/test_rknn_cli.py tests/cli/test_vae_rknn_cli.py tests/cli/test_doctor.py tests/cli/test_make_tiny_blocks.py tests/cli/test_turbo.py tests/export/test_rknn_int8.py tests/cli/test_rknn_int8_cli.py tests/cli/test_rknn_full_disk_cli.py "$@"
