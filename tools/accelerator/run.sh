#!/usr/bin/env bash
# The accelerator machine's run: TensorFlow for CUDA carried in, the gpu-marked tests,
# the throughput suite on the GPU, the CPU scaling bench on its cores, results/ files.
#
# The machine (/work/.library/device/README.md): one NVIDIA H100, 16 cores, Python 3.12
# with CUDA 13 libraries, no package registry, nothing reachable; each call of the
# device tool carries the working tree plus named ignored paths, 64 MiB in all, and a
# warm machine keeps what earlier calls left under ignored paths for 30 s after each.
# So: pack here into parts that fit a call beside the tree, carry one part a call,
# reassemble and install there, then run the phases, each within one call's 10 minutes.
#
# Here (needs the network, ~10 min for the downloads, ~20 min of xz on 2 cores):
#   tools/accelerator/run.sh pack [--full]   # .accel/wheels -> .accel/site -> .accel/parts/NN
#   tools/accelerator/run.sh plan            # the device calls, in order, with their carry
#   tools/accelerator/run.sh rehearse        # reassembles the parts as the device will
# There (each a device-tool call; `plan` prints them):
#   tools/accelerator/run.sh status          # which parts arrived
#   tools/accelerator/run.sh install         # reassemble, verify, unpack, CUDA libraries, GPU check
#   tools/accelerator/run.sh machine|gpu-tests|bench-gpu MODEL|bench-cpu WORKLOAD
# Every phase accepts --dry-run (print what it would run). Phases there write to $OUT.
# Then here:
#   tools/accelerator/run.sh collect FILES_DIR   # $OUT's files into results/accelerator/
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tools/accelerator"
ACCEL="$ROOT/.accel"              # Ignored (.gitignore): wheels, site, parts, caches.
LIMIT_MIB=64                      # One call's tree plus carried paths.
MARGIN_MIB=3                      # For files the tree gains between pack and the calls.
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
CUDA12_RUNTIME="nvidia-cuda-runtime-cu12==12.9.79"
# Never needed at run time, 400 MB of the TensorFlow wheel (C++ headers, XLA AOT sources).
STRIP=(tensorflow/include tensorflow/xla_aot_runtime_src)
DRY=0
for arg in "$@"; do [[ "$arg" == --dry-run ]] && DRY=1; done
set -- "${@/--dry-run/}"

say() { echo "[accelerator] $*" >&2; }
run() { if ((DRY)); then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi; }
out() { echo "${OUT:-$ROOT/.accel/out}"; }
device_python() {   # The image's Python 3.12 (the one with PyTorch); here, any that runs.
  for py in /opt/torch/.venv/bin/python3 python3.12 python3; do
    "$py" -c 'import sys' >/dev/null 2>&1 && { echo "$py"; return; }
  done
  say "no python3 found"; exit 1
}

tree_bytes() {   # What a call carries besides the named paths: tracked + untracked-not-ignored.
  (cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
   awk '{s += $1} END {print s + 0}')
}

part_mib() {
  local tree=$(( $(tree_bytes) / 1048576 + 1 ))
  echo $(( LIMIT_MIB - tree - MARGIN_MIB ))
}

# ---------------------------------------------------------------- here
cmd_pack() {
  local full=0; [[ "${1:-}" == --full ]] && full=1
  local pip="$ROOT/.venv/bin/pip"; [[ -x "$pip" ]] || pip="python3 -m pip"
  df -h "$ROOT" | tail -1 | awk '{print "[accelerator] disk free here: " $4}' >&2
  local reqs=(-r "$HERE/requirements.txt" "$CUDA12_RUNTIME")
  ((full)) && reqs+=(-r "$HERE/cuda12.txt")
  run mkdir -p "$ACCEL/wheels"
  say "downloading cp312 manylinux wheels into $ACCEL/wheels (tensorflow alone is 546 MiB)"
  run $pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$ACCEL/wheels" "${reqs[@]}"
  say "unpacking them into $ACCEL/site (what PYTHONPATH names there)"
  run rm -rf "$ACCEL/site" "$ACCEL/parts" "$ACCEL/payload.tar.xz"
  run $pip install -q --no-deps --no-compile --no-index --find-links "$ACCEL/wheels" \
    --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    --target "$ACCEL/site" "${reqs[@]}"
  for path in "${STRIP[@]}"; do run rm -rf "$ACCEL/site/$path"; done
  run rm -rf "$ACCEL/site/bin"
  say "compressing (xz -6, all cores: about 20 minutes on 2 cores)"
  if ((DRY)); then echo "+ tar -C $ACCEL -cf - site | xz -T0 -6 > $ACCEL/payload.tar.xz"
  else tar -C "$ACCEL" -cf - site | xz -T0 -6 > "$ACCEL/payload.tar.xz"; fi
  cmd_split
}

cmd_split() {   # payload.tar.xz -> parts/NN/chunk, each with the MANIFEST
  local mib; mib=$(part_mib)
  ((mib >= 8)) || { say "the working tree leaves only ${mib} MiB a call: too little"; exit 1; }
  run rm -rf "$ACCEL/parts"; run mkdir -p "$ACCEL/parts"
  ((DRY)) && { echo "+ split -b ${mib}M payload.tar.xz into $ACCEL/parts/NN/chunk"; return; }
  local tmp="$ACCEL/split"; rm -rf "$tmp"; mkdir -p "$tmp"
  split -b "${mib}M" -d -a 2 "$ACCEL/payload.tar.xz" "$tmp/"
  local n=0; for f in "$tmp"/*; do n=$((n + 1)); done
  {
    echo "parts $n"
    echo "part_mib $mib"
    echo "payload_bytes $(stat -c %s "$ACCEL/payload.tar.xz")"
    echo "payload_sha256 $(sha256sum "$ACCEL/payload.tar.xz" | cut -d' ' -f1)"
    for f in "$tmp"/*; do echo "chunk $(basename "$f") $(sha256sum "$f" | cut -d' ' -f1)"; done
  } > "$ACCEL/MANIFEST"
  for f in "$tmp"/*; do
    local d="$ACCEL/parts/$(basename "$f")"; mkdir -p "$d"
    mv "$f" "$d/chunk"; cp "$ACCEL/MANIFEST" "$d/MANIFEST"
  done
  rmdir "$tmp"
  say "$n parts of at most $mib MiB (tree $(( $(tree_bytes) / 1048576 )) MiB + part + margin <= $LIMIT_MIB MiB)"
  cat "$ACCEL/MANIFEST" | head -4 >&2
}

cmd_plan() {   # The device calls, in order.
  [[ -f "$ACCEL/MANIFEST" ]] || { say "no pack yet: run '$0 pack' first"; exit 1; }
  local n; n=$(awk '/^parts/ {print $2}' "$ACCEL/MANIFEST")
  local tree=$(( $(tree_bytes) / 1048576 ))
  local biggest=$(( $(du -b "$ACCEL"/parts/*/chunk | sort -n | tail -1 | cut -f1) / 1048576 + 1 ))
  ((tree + biggest <= LIMIT_MIB)) || say "WARNING: tree $tree MiB + part $biggest MiB > $LIMIT_MIB MiB: pack again"
  cat <<EOF
Device calls (the device tool's run), back to back: a warm machine keeps .accel/ for 30 s
after each call; if it went back, 'status' says which parts to carry again.
Tree $tree MiB + one part (at most $biggest MiB) a call. Device time: ~1-2 min to start,
then the minutes below (estimates for one H100 and 16 cores; 45 min in all at most).
EOF
  local i=0
  for d in "$ACCEL"/parts/*; do
    i=$((i + 1))
    echo "$i. carry [\".accel/parts/$(basename "$d")\"]  command: tools/accelerator/run.sh status   (~0.5 min)"
  done
  cat <<EOF
$((i + 1)). command: tools/accelerator/run.sh install                      (~2 min: unpack, CUDA libraries, GPU check)
$((i + 2)). command: tools/accelerator/run.sh machine && tools/accelerator/run.sh gpu-tests   (~4 min)
$((i + 3)). command: tools/accelerator/run.sh bench-gpu resnet50           (~5 min: 3 precisions)
$((i + 4)). command: tools/accelerator/run.sh bench-gpu sngan128 float32,mixed_bfloat16   (~5 min)
$((i + 5)). command: tools/accelerator/run.sh bench-gpu sngan128 mixed_float16            (~3 min)
$((i + 6)). command: tools/accelerator/run.sh bench-gpu d4pg_pixels        (~3 min)
$((i + 7)). command: tools/accelerator/run.sh bench-cpu resnet             (~5 min: 1, 2, 4, 8 workers)
$((i + 8)). command: tools/accelerator/run.sh bench-cpu sngan              (~5 min)
$((i + 9)). command: tools/accelerator/run.sh bench-cpu d4pg               (~5 min)
About 45 minutes with the start and the transfers: with less device time, keep the order
and stop early (the GPU figures first, then ResNet's CPU scaling).
Each call returns its files from \$OUT; after each: tools/accelerator/run.sh collect <files_at>.
Every call must name timeout_s <= 600; each phase stops itself at 9 minutes (timeout 540),
and the throughput bench writes its table after every run, so a cut call keeps its rows.
EOF
}

cmd_rehearse() {   # Here: what install does with the parts, up to (not including) the GPU.
  local dir; dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  mkdir -p "$dir/.accel/parts"
  cp -r "$ACCEL"/parts/* "$dir/.accel/parts/"
  ACCEL="$dir/.accel" reassemble
  local got; got=$(du -sb "$dir/.accel/site" | cut -f1)
  if [[ -d "$ACCEL/site" ]]; then   # The packed tree, if still here: the same bytes.
    local want; want=$(du -sb "$ACCEL/site" | cut -f1)
    [[ "$want" == "$got" ]] || { say "unpacked $got bytes, packed $want"; exit 1; }
  fi
  say "rehearsal passed: parts reassemble, checksums match, site unpacks ($got bytes)"
}

cmd_collect() {   # Here: a device call's returned files into results/accelerator/.
  local from="$1" dest="$ROOT/results/accelerator"
  mkdir -p "$dest"
  for f in "$from"/*; do run cp "$f" "$dest/"; say "results/accelerator/$(basename "$f")"; done
}

# ---------------------------------------------------------------- there
manifest() { ls "$ACCEL"/parts/*/MANIFEST 2>/dev/null | head -1; }

cmd_status() {
  local m; m=$(manifest)
  [[ -n "$m" ]] || { say "no part has arrived"; return 0; }
  local missing=()
  while read -r _ name sha; do
    [[ -f "$ACCEL/parts/$name/chunk" ]] || missing+=("$name")
  done < <(grep '^chunk' "$m")
  say "$(grep '^parts' "$m" | cut -d' ' -f2) parts; missing: ${missing[*]:-none}"
  [[ -f "$ACCEL/installed" ]] && say "installed: $(cat "$ACCEL/installed")"
  df -h "$ROOT" | tail -1 | awk '{print "[accelerator] disk free: " $4}' >&2
}

reassemble() {   # parts -> payload (checked) -> $ACCEL/site
  local m; m=$(manifest)
  [[ -n "$m" ]] || { say "no parts under $ACCEL/parts"; exit 1; }
  while read -r _ name sha; do
    [[ -f "$ACCEL/parts/$name/chunk" ]] || { say "part $name is missing: carry .accel/parts/$name"; exit 1; }
    echo "$sha  $ACCEL/parts/$name/chunk"
  done < <(grep '^chunk' "$m") | sha256sum --quiet -c - || { say "a part is corrupt"; exit 1; }
  local want; want=$(awk '/^payload_sha256/ {print $2}' "$m")
  local got; got=$(cat "$ACCEL"/parts/*/chunk | sha256sum | cut -d' ' -f1)
  [[ "$want" == "$got" ]] || { say "payload checksum differs"; exit 1; }
  rm -rf "$ACCEL/site"
  # Python's own lzma and tarfile: no xz program needed there.
  cat "$ACCEL"/parts/*/chunk | "$(device_python)" -c 'import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1], filter="tar")' "$ACCEL"
}

cmd_install() {
  if ((DRY)); then echo "+ reassemble $ACCEL/parts -> $ACCEL/site; link CUDA 13 libraries under CUDA 12 names in $ACCEL/cuda12; check the GPU"; return; fi
  local py; py=$(device_python)
  reassemble
  "$py" "$HERE/cuda_libraries.py" "$ACCEL/cuda12" "$ACCEL/site"
  environment
  "$py" - <<'EOF'
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("TensorFlow", tf.__version__, "built for CUDA", tf.sysconfig.get_build_info().get("cuda_version"),
      "sees", gpus)
assert gpus, "TensorFlow sees no GPU: see the dlopen lines above (TF_CPP_MIN_LOG_LEVEL=0)"
with tf.device("/GPU:0"):
  x = tf.random.normal([8, 56, 56, 64])
  conv = tf.nn.conv2d(x, tf.random.normal([3, 3, 64, 64]), 1, "SAME")
  mm = tf.linalg.matmul(tf.random.normal([1024, 1024]), tf.random.normal([1024, 1024]))
  fft = tf.signal.fft(tf.complex(x, x))
print("conv", conv.device, "matmul", mm.device, "fft", fft.device, "ok")
EOF
  date -u +%FT%TZ > "$ACCEL/installed"
  say "installed; PYTHONPATH=$ACCEL/site"
}

environment() {
  export PYTHONPATH="$ACCEL/site:$ROOT" LD_LIBRARY_PATH="$ACCEL/cuda12:${LD_LIBRARY_PATH:-}"
  export CUDA_CACHE_PATH="$ACCEL/cuda-cache" CUDA_CACHE_MAXSIZE=4294967296   # PTX JIT (sm_90)
  export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}" PYTHONUNBUFFERED=1
}

needs_install() {
  ((DRY)) && return 0
  [[ -f "$ACCEL/installed" ]] || { say "not installed: carry the parts and run install first"; exit 1; }
}

cmd_machine() {   # results/accelerator/machine.md: what the figures ran on
  needs_install; environment
  local py f; py=$(device_python); f="$(out)/machine.md"; mkdir -p "$(out)"
  ((DRY)) && { echo "+ nvidia-smi, lscpu, free, python and package versions > $f"; return; }
  {
    echo "# The accelerator machine ($(date -u +%F))"; echo
    echo '```'; nvidia-smi || true; echo '```'; echo
    echo '```'; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(|Flags' | cut -c1-300; free -g; echo '```'
    echo '```'; uname -r; "$py" -c "import sys, tensorflow as tf, numpy; print(sys.version); print('tensorflow', tf.__version__, tf.sysconfig.get_build_info()); print('numpy', numpy.__version__); print(tf.config.list_physical_devices())" 2>&1 | grep -v '^[WIE]0000\|^WARNING: All'; echo '```'
    echo "replibench commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "CUDA libraries TensorFlow loads (.accel/cuda12 -> the image's):"; ls -l "$ACCEL/cuda12" | awk 'NR > 1 {print "  " $9 " -> " $11}'
  } > "$f"
  say "wrote $f"
}

cmd_gpu_tests() {
  needs_install; environment
  local py; py=$(device_python)
  local files; files=$(cd "$ROOT" && grep -l "mark.gpu" tests/*.py | tr '\n' ' ')
  mkdir -p "$(out)"
  (cd "$ROOT" && run timeout 540 "$py" -m pytest -p no:xdist -p no:cacheprovider -q -rs -m gpu $files \
     2>&1 | tee "$(out)/gpu_tests.log")
}

cmd_bench_gpu() {   # MODEL [PRECISIONS]: the throughput suite on the GPU (default: 3 precisions)
  needs_install; environment
  local py; py=$(device_python) model="${1:?model: resnet50, sngan128 or d4pg_pixels}"
  local precisions="${2:-float32,mixed_bfloat16,mixed_float16}" name="throughput-gpu-$model"
  [[ -n "${2:-}" ]] && name+="-${2//,/-}"
  mkdir -p "$(out)"
  (cd "$ROOT" && run timeout 540 "$py" benchmarks/throughput.py --machine=gpu --models="$model" \
     --precisions="$precisions" --out="$(out)/$name" 2>&1 | tee "$(out)/$name.log")
}

cmd_bench_cpu() {   # WORKLOAD: 1, 2, 4 and 8 worker processes, 2 cores each, on 16 cores
  needs_install; environment
  local py; py=$(device_python) workload="${1:?workload: resnet, sngan or d4pg}"
  mkdir -p "$(out)"
  (cd "$ROOT" && CUDA_VISIBLE_DEVICES= run timeout 540 "$py" benchmarks/scaling.py \
     --workloads="$workload" --worker_counts=1,2,4,8 --cpus_per_worker=2 --rounds=1 \
     2>&1 | tee "$(out)/scaling-cpu-$workload.txt")
}

case "${1:-}" in
  pack) shift; cmd_pack "$@" ;;
  split) cmd_split ;;
  plan) cmd_plan ;;
  rehearse) cmd_rehearse ;;
  collect) shift; cmd_collect "$@" ;;
  status) cmd_status ;;
  install) cmd_install ;;
  machine) cmd_machine ;;
  gpu-tests) cmd_gpu_tests ;;
  bench-gpu) shift; cmd_bench_gpu "$@" ;;
  bench-cpu) shift; cmd_bench_cpu "$@" ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
