#!/usr/bin/env bash
# The main job on a fresh machine: install, make a small model set, generate an image into out/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cli="$root/.venv/bin/anima-rknn"
[ -f "$root/models/tiny/split_files/vae/wan-vae-tiny-random.safetensors" ] || "$cli" make-tiny --out "$root/models/tiny"
mkdir -p "$root/out"
"$cli" generate --model "$root/models/tiny" --prompt "a red circle on a blue background, top left" \
  --cache spectrum --out "$root/out/demo.png" --overwrite "$@"
