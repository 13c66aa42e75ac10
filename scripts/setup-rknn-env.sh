#!/usr/bin/env bash
# Creates .venv-rknn: rknn-toolkit2 (converter + x86 simulator) pins numpy/onnx/protobuf versions that
# clash with the main .venv, so it lives in its own environment. Safe to run again: pip skips what is there.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-rknn"
constraints="$root/constraints/rknn.txt"
python="${PYTHON:-python3.11}"
start=$(date +%s)

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet -c "$constraints")

"${pip[@]}" "setuptools<80.1" wheel  # the toolkit imports pkg_resources
"${pip[@]}" numpy onnx protobuf onnxruntime opencv-python-headless torch
# The toolkit declares torch<=2.4 and opencv-python; conversion works with torch 2.13 and headless OpenCV,
# so skip its pins (pip's next step then prints a resolver ERROR about them: expected, harmless).
"${pip[@]}" --no-deps rknn-toolkit2
"${pip[@]}" scipy fast-histogram psutil ruamel.yaml tqdm
"${pip[@]}" --no-deps -e "$root"
"${pip[@]}" safetensors gguf tokenizers "transformers<6" huggingface_hub pillow click pytest onnxscript  # onnxscript: torch.onnx.export

"$venv/bin/python" -c "from rknn.api import RKNN; import numpy, torch; print('rknn-toolkit2 ok: numpy', numpy.__version__, 'torch', torch.__version__)"
echo "set up $venv in $(( $(date +%s) - start )) s"
