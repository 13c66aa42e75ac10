#!/usr/bin/env bash
# The board, emulated: an arm64 Debian 12 (bookworm) root made with debootstrap and run through qemu-user-static,
# in which the project is installed the way the README's board section tells a ROCK 5C owner, then checked:
# the demo generate, `import rknnlite`, `--backend rknn` refused in one line where there is no NPU, `doctor`'s report
# there, and the slice
# of the test suite whose numerics matter on ARM (run on the torch that the board gets). Root only.
#
#   sudo bash scripts/board-check.sh [--fresh] [--full]
#
# The root folder is kept (ANIMA_BOARD_ROOT, default /var/cache/anima-board/bookworm-arm64) so that a second
# run skips debootstrap and apt; --fresh rebuilds it. The venv and the install are made anew on every run (pip's
# download cache in the root is kept). Exit 0 only if every step passed; the last line sums the steps up.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "board-check.sh: needs root (debootstrap, chroot, binfmt_misc): run it with sudo" >&2
  exit 2
fi
fresh=0
full=0
for arg in "$@"; do
  case "$arg" in
    --fresh) fresh=1 ;;
    --full) full=1 ;;
    *) echo "board-check.sh: unknown argument $arg (usage: board-check.sh [--fresh] [--full])" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
board="${ANIMA_BOARD_ROOT:-/var/cache/anima-board/bookworm-arm64}"
mirror="${ANIMA_BOARD_MIRROR:-http://deb.debian.org/debian}"
ready="$board/.anima-board-ready"  # written once debootstrap and apt have finished
app=/opt/anima                      # inside the root: the source copy, the venv, the converted set
venv="$app/venv"
passed=()
failed=()

say() { printf '\n== %s\n' "$*"; }

# Runs a command inside the root with a clean environment: none of this host's pip settings (its find-links
# hold x86 wheels from this disk) reach the board's install. PIP_CERT: the host's CA bundle, copied in below.
# QEMU_CPU: the RK3588's big core. qemu's default CPU ("max") has SVE, which torch's kernels then use and the
# emulator runs 6-14x slower (a 256x256 matmul: 15.8 s against 1.09 s), and which the board's cores do not have.
in_root() {
  QEMU_CPU=cortex-a76 chroot "$board" /usr/bin/env -i QEMU_CPU=cortex-a76 HOME=/root LANG=C.UTF-8 TMPDIR=/tmp \
    PIP_CERT=/etc/ssl/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "$@"
}

# step NAME COMMAND...: runs one check, records whether it passed, and goes on either way.
step() {
  local name="$1"; shift
  say "$name"
  # A subshell outside any `if`, so that set -e stops the step at its first failing command.
  local code=0
  set +e
  (set -e; "$@")
  code=$?
  set -e
  if [ "$code" -eq 0 ]; then passed+=("$name"); else failed+=("$name"); echo "-- $name FAILED (exit $code)"; fi
}

summary() {
  local total=$(( ${#passed[@]} + ${#failed[@]} ))
  if [ "${#failed[@]}" -eq 0 ]; then
    echo "board-check: PASS, ${#passed[@]}/$total steps (${passed[*]})"
  else
    echo "board-check: FAIL, ${#failed[@]}/$total steps failed (${failed[*]}); passed: ${passed[*]:-none}"
    exit 1
  fi
}

host_tools() {
  if ! command -v debootstrap >/dev/null || [ ! -e /usr/lib/binfmt.d/qemu-aarch64.conf ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap qemu-user-static
  fi
  # qemu-user-static's binfmt entry (flag F: the interpreter is opened now, so the root needs no copy of it).
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    cat /usr/lib/binfmt.d/qemu-aarch64.conf >/proc/sys/fs/binfmt_misc/register
  fi
  grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64
}

mount_root() {
  mountpoint -q "$board/proc" || mount -t proc proc "$board/proc"
  mountpoint -q "$board/sys" || mount -t sysfs sysfs "$board/sys"
  if ! mountpoint -q "$board/dev"; then
    mount --rbind /dev "$board/dev"
    mount --make-rslave "$board/dev"
  fi
}

unmount_root() {
  for dir in dev sys proc; do
    if mountpoint -q "$board/$dir"; then umount -R "$board/$dir" || umount -lR "$board/$dir"; fi
  done
}

# The board image's part: Debian 12 and the README's apt packages. Kept between runs (the marker file).
make_root() {
  if [ "$fresh" = 1 ] || [ ! -e "$ready" ]; then
    unmount_root
    rm -rf "$board"
    mkdir -p "$(dirname "$board")"
    debootstrap --arch=arm64 --variant=minbase bookworm "$board" "$mirror"
  fi
  # pip inside the root reaches PyPI through this host's network settings and CA bundle (a file of its own:
  # Debian's ca-certificates, which python3-venv pulls in, rewrites ca-certificates.crt).
  cp /etc/resolv.conf "$board/etc/resolv.conf"
  mkdir -p "$board/etc/ssl"  # a new minbase root has no /etc/ssl until apt installs ca-certificates
  cp /etc/ssl/certs/ca-certificates.crt "$board/etc/ssl/host-ca-bundle.crt"
  mount_root
  if [ ! -e "$ready" ]; then
    in_root apt-get update -qq
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv
    touch "$ready"
  fi
  in_root uname -m | grep -qx aarch64
  in_root python3 --version
}

# A subgraph set of the demo model converted for rk3588, as convert-rknn writes it on a PC, copied to the
# "board" without its .onnx files (the README's rsync). Made on this host: conversion needs rknn-toolkit2.
convert_set() {
  [ -x "$repo/.venv/bin/anima-rknn" ] || bash "$repo/scripts/setup.sh"
  [ -x "$repo/.venv-rknn/bin/anima-rknn" ] || bash "$repo/scripts/setup-rknn-env.sh"
  local work; work="$(mktemp -d)"
  "$repo/.venv/bin/anima-rknn" export-onnx -W 64 -H 64 --dtype fp16 --out "$work/onnx" &&
    "$repo/.venv-rknn/bin/anima-rknn" convert-rknn --subgraphs "$work/onnx" --out "$work/rknn" &&
    rm -rf "$board$app/rknn-demo-64" && mkdir -p "$board$app" &&
    cp -r "$work/rknn" "$board$app/rknn-demo-64" && find "$board$app/rknn-demo-64" -name '*.onnx' -delete
  local status=$?
  rm -rf "$work"
  return $status
}

# The README's install: a venv from Debian's python3 and `pip install '.[board]'` from the repository. The
# source is this working tree (tracked and untracked files, not the ignored ones); everything else comes
# from PyPI, nothing from this host's disk.
install_project() {
  rm -rf "$board$app/src" "$board$venv"
  mkdir -p "$board$app/src"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$board$app/src"
  in_root python3 -m venv "$venv" &&
    in_root sh -c "cd $app/src && pip install '.[board]'" &&
    in_root anima-rknn --help >/dev/null
}

demo_generate() {
  rm -f "$board/tmp/board-demo.png"
  in_root anima-rknn generate --prompt "a red circle on a blue background, top left" --out /tmp/board-demo.png &&
    in_root python -c "
from PIL import Image
image = Image.open('/tmp/board-demo.png')
assert image.format == 'PNG' and image.size == (64, 64), (image.format, image.size)
assert 'parameters' in image.info, 'no parameters text in the PNG'
assert len(image.convert('RGB').getcolors(64 * 64)) > 16, 'a flat picture'
print('demo PNG:', image.size, image.mode)"
}

import_rknnlite() {
  in_root python -c "from rknnlite.api import RKNNLite; import rknnlite; print('rknnlite', RKNNLite.__name__, rknnlite.__path__[0])"
}

# No /dev/rknpu and no librknnrt.so here, as on a board image without the NPU runtime: generate must refuse in
# one line that names librknnrt, exit non-zero and write no file.
rknn_without_npu() {
  local err="$board/tmp/no-npu.err" code=0
  rm -f "$board/tmp/no-npu.png"
  if [ -e "$board/dev/rknpu" ] || in_root sh -c 'ls /usr/lib/librknnrt.so /usr/lib/*/librknnrt.so' 2>/dev/null; then
    echo "this root has an NPU or its runtime: the check needs neither"; return 1
  fi
  in_root anima-rknn generate --prompt "a red circle" --backend rknn --subgraphs "$app/rknn-demo-64" \
    --out /tmp/no-npu.png >/dev/null 2>"$err" || code=$?
  echo "exit $code: $(cat "$err")"
  [ "$code" -ne 0 ] && [ "$(wc -l <"$err")" -eq 1 ] && grep -q librknnrt "$err" && ! grep -q Traceback "$err" &&
    [ ! -e "$board/tmp/no-npu.png" ]
}

# `doctor` where there is no NPU: every check on its line, the NPU and librknnrt FAIL, exit 1, no traceback.
doctor_without_npu() {
  local out="$board/tmp/doctor.out" code=0
  in_root anima-rknn doctor --subgraphs "$app/rknn-demo-64" >"$out" 2>&1 || code=$?
  cat "$out"
  echo "exit $code"
  [ "$code" -eq 1 ] && grep -q "^FAIL npu " "$out" && grep -q "^FAIL runtime " "$out" && ! grep -q Traceback "$out"
}

# The tests whose numbers depend on the CPU and the torch version, cut to what emulation runs in reasonable time
# (the whole files take hours under qemu): the DiT against diffusers on the tiny set (a full pass and one block),
# the samplers against k-diffusion's and diffusers' own at one schedule (simple, 5 steps, shift 3), the Spectrum
# cache, the PNG metadata, and resume's bit-identity (a stochastic multistep sampler with the Spectrum cache,
# stopped after a forecast step: three runs; the cache-by-cache case first renders every cache's reference, five
# more). --full adds the whole pipeline against diffusers' and more resume cases (several times longer).
SLICE_FILES=(tests/model/test_dit.py tests/sampling/test_sampler_references.py tests/sampling/test_spectrum.py
             tests/generation/test_result.py tests/generation/test_resume.py)
SLICE_K="test_dit or simple-5-3.0 or dpmpp_sde_matches or test_spectrum or path_gets_the_png \
or parameters_text_names or bit_identically[dpmpp_2m_sde]"
if [ "$full" = 1 ]; then
  SLICE_FILES+=(tests/generation/test_pipeline_diffusers.py)
  SLICE_K+=" or test_generation_matches_diffusers_anima_pipeline or test_result or bit_identical[5-spectrum] \
or bit_identical[5-none] or bit_identical[5-auto] or bit_identically[sa_solver]"
fi

# The slice's references come from [test] at its own pins (read from pyproject.toml), with scipy for
# k-diffusion's sampling module and k-diffusion itself without its training stack, as scripts/setup.sh does.
test_slice() {
  in_root python - <<'EOF' >"$board/tmp/test-requirements.txt"
import tomllib
from packaging.requirements import Requirement
wanted = {"pytest", "diffusers", "torchsde", "torchdiffeq"}
test = tomllib.load(open("/opt/anima/src/pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]
print("\n".join(line for line in test if Requirement(line).name in wanted))
print("scipy")
EOF
  cat "$board/tmp/test-requirements.txt"
  in_root pip install --quiet -r /tmp/test-requirements.txt
  in_root pip install --quiet --no-deps k-diffusion==0.1.1.post1
  # One torch thread, as the tests ask of theirs (conftest's one_thread) but from the start, for the tiny set's
  # fixture too: under qemu the OpenMP threads' spin-waiting, on CPUs shared with the host, is emulated as well.
  in_root env OMP_NUM_THREADS=1 sh -c "cd $app/src && pytest -q -p no:cacheprovider ${SLICE_FILES[*]} -k '$SLICE_K'"
}

report() {
  local site
  site="$(in_root python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  in_root pip list
  echo "installed package folders, largest first:"
  (cd "$board$site" && du -s --block-size=1M -- */ | sort -rn | head -25)
  echo "site-packages: $(du -sh "$board$site" | cut -f1)   torch package: $(du -sh "$board$site/torch" | cut -f1)"
  in_root python -c "
import torch
print('the board gets torch', torch.__version__, 'cuda:', torch.version.cuda, 'machine:', __import__('platform').machine())"
}

trap unmount_root EXIT
step host-tools host_tools
step root make_root
if [ "${#failed[@]}" -eq 0 ]; then
  step convert-set convert_set
  step install install_project
  if [[ " ${failed[*]} " != *" install "* ]]; then
    step demo-generate demo_generate
    step import-rknnlite import_rknnlite
    [[ " ${failed[*]} " == *" convert-set "* ]] || step rknn-without-npu rknn_without_npu
    [[ " ${failed[*]} " == *" convert-set "* ]] || step doctor doctor_without_npu
    step report report
    step test-slice test_slice
  fi
fi
say summary
summary
