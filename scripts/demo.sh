#!/usr/bin/env bash
# The main job on a fresh machine: install, then
#  1. draw a picture with the shipped trained demo model (64x64, nothing to download), and
#  2. make a random-weight model set in the real Anima file formats on the spot and generate with it
#     (noise: it shows every real-format stage running, not a picture).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cli="$root/.venv/bin/anima-rknn"
mkdir -p "$root/out"
"$cli" generate --prompt "a red circle on a blue background, top left" --cache spectrum \
  --out "$root/out/demo.png" --overwrite "$@"
"$cli" make-tiny --out "$root/models/tiny" --overwrite
"$cli" generate --model "$root/models/tiny" --prompt "1girl, (smile:1.2), looking at viewer" --width 256 \
  --height 256 --cache spectrum --out "$root/out/tiny-random.png" --overwrite
