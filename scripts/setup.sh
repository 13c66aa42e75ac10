#!/usr/bin/env bash
# Creates .venv with the package and its test dependencies. Safe to run again.
# torch is pinned to the CPU build that this machine's pip finds on disk (a bare `torch` pulls CUDA).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
[ -x "$venv/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$venv"
# pip's output goes to a log that is shown only when the install fails. k-diffusion (the samplers' reference in the
# tests) comes without its dependencies: they are its training stack, and its torchvision would replace nothing
# but break this CPU torch; its sampling module's own needs (scipy, torchsde, torchdiffeq) are in [test].
if ! { "$venv/bin/python" -m pip install --quiet --upgrade pip &&
       "$venv/bin/python" -m pip install --quiet torch==2.13.0 -e "$root[test]" &&
       "$venv/bin/python" -m pip install --quiet --no-deps k-diffusion==0.1.1.post1; } >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" >&2
  exit 1
fi
"$venv/bin/python" -c "import anima_rknn, torch; print('anima-rknn ready: torch', torch.__version__)"
