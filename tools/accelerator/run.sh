#!/usr/bin/env bash
# The accelerator machine's run: what a lent GPU machine's 15 minutes buy, in this order
# (issue 41): install; the Keras `model.fit` peer of ResNet-50 (with and without
# jit_compile); ResNet-50, SN-GAN 128 and D4PG pixels with and without XLA
# (Experiment.jit_compile) in bfloat16 and float16, ResNet-50's rows each with a profile
# and its top ops; then the CPU scaling phase (ResNet, SN-GAN, D4PG at 1, 2, 4, 8 worker
# processes of 2 cores). `plan` prints the device calls with their time budget.
#
# Two ways to run it:
#  - A GPU machine with a package index (the ordinary path): `make install`, then
#    `.venv/bin/pip install 'tensorflow[and-cuda]==2.21.*'`, then `make bench-accelerator`
#    (every phase below with the venv's Python, into results/latest/accelerator/).
#  - The lent machine (/work/.library/device/README.md): one GPU, 16 cores, Python 3.12
#    with CUDA 13 libraries, no package registry, nothing reachable; each call of the
#    device tool carries the working tree plus named ignored paths, 64 MiB in all, and a
#    warm machine keeps what earlier calls left under ignored paths for 30 s after each.
#    So: pack here into parts that fit a call beside the tree (TensorFlow and what the
#    image lacks, and the Fashion-MNIST files the CPU phase trains on), carry one part a
#    call, reassemble and install there, then run the phases, each within one call.
#
# Here (needs the network: ~10 min of downloads; xz -1 on 2 cores, `pack` times it):
#   tools/accelerator/run.sh pack [--full]   # .accel/wheels -> .accel/site (+ datasets) -> .accel/parts/NN
#   tools/accelerator/run.sh plan            # the device calls, in order, with their carry and budget
#   tools/accelerator/run.sh rehearse        # reassembles the parts as the device will
#   tools/accelerator/run.sh all --dry-run   # every phase's commands, in order
# There (each a device-tool call; `plan` prints them):
#   tools/accelerator/run.sh status          # which parts arrived
#   tools/accelerator/run.sh install         # reassemble, verify, unpack, CUDA libraries, GPU check
#   tools/accelerator/run.sh machine|gpu-tests|keras-peer|bench-xla MODEL|bench-cpu [WORKLOADS]
#   tools/accelerator/run.sh bench-gpu MODEL [PRECISIONS]   # the default step, 3 precisions
# Every phase accepts --dry-run (print what it would run) and prints UTC timestamps at its
# start and end. Phases there write to $OUT (here: .accel/out). Then here:
#   tools/accelerator/run.sh collect FILES_DIR   # $OUT's files into results/accelerator/, then goals.md (benchmarks/throughput/gpu_goals.py)
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
# xz -6: 384 MiB, 7 parts, 35 min on 2 busy cores. xz -1 (2026-11-27): 1,674 MiB into
# 477 MiB with the data, 9 parts, 3.6 min of CPU (12 min of wall on 2 cores at load 8).
XZ_LEVEL="${XZ_LEVEL:-1}"
FMNIST_SRC="${FMNIST_SRC:-/usr/share/datasets/fashion-mnist}"   # `make data` fills it.
FMNIST_FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
              t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
DRY=0
for arg in "$@"; do [[ "$arg" == --dry-run ]] && DRY=1; done
set -- "${@/--dry-run/}"

say() { echo "[accelerator] $(date -u +%T) $*" >&2; }
PHASE_T0=0
begin() { PHASE_T0=$SECONDS; say "== $* : start $(date -u +%FT%TZ)"; }
finish() { say "== $* : end $(date -u +%FT%TZ) ($((SECONDS - PHASE_T0)) s)"; }
run() { if ((DRY)); then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi; }
out() { echo "${OUT:-$ROOT/.accel/out}"; }
device_python() {   # $ACCEL_PYTHON (the ordinary path: a venv); else the image's Python 3.12
  # (the one with PyTorch); here, any that runs.
  for py in ${ACCEL_PYTHON:-} /opt/torch/.venv/bin/python3 python3.12 python3; do
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
  pack_datasets
  say "compressing site and datasets (xz -$XZ_LEVEL, all cores)"
  local t0=$SECONDS
  if ((DRY)); then echo "+ tar -C $ACCEL -cf - site datasets | xz -T0 -$XZ_LEVEL > $ACCEL/payload.tar.xz"
  else tar -C "$ACCEL" -cf - site datasets | xz -T0 "-$XZ_LEVEL" > "$ACCEL/payload.tar.xz"; fi
  ((DRY)) || say "compressed $(du -sm "$ACCEL/site" | cut -f1) MiB into $(( $(stat -c %s "$ACCEL/payload.tar.xz") / 1048576 )) MiB in $((SECONDS - t0)) s (xz -$XZ_LEVEL, $(nproc) cores)"
  cmd_split
}

pack_datasets() {   # The CPU scaling phase's Fashion-MNIST: the four IDX files, as they are.
  run mkdir -p "$ACCEL/datasets/fashion-mnist"
  for f in "${FMNIST_FILES[@]}"; do
    [[ -f "$FMNIST_SRC/$f" ]] || { say "$FMNIST_SRC/$f is missing: run 'make data' first (or set FMNIST_SRC)"; exit 1; }
    run cp "$FMNIST_SRC/$f" "$ACCEL/datasets/fashion-mnist/"
  done
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

# The device calls after the parts, in the order the budget buys them: session, name,
# seconds estimated (one H100/H200 and 16 cores; the 2026-11-26 H200 run measured the
# start at 30 s and install at 35 s; the rest are guesses), the phase's own time limit,
# and the command. Each limit is under a call's 10 minutes. One lent machine's 15
# minutes (start, parts and install included) hold one session: A, the GPU half; B and
# C, the CPU scaling phase, one workload a call (benchmarks/scaling/scaling.py at 1, 2, 4, 8
# workers of 2 cores, strong and weak, and D's ceiling runs: ~5 min a workload). With
# time left on a machine, go on with the next session's phases after installing once.
PHASES=(
  "A|install|45|300|tools/accelerator/run.sh install && tools/accelerator/run.sh machine"
  "A|keras-peer|130|240|tools/accelerator/run.sh keras-peer"
  "A|bench-xla resnet50|200|330|tools/accelerator/run.sh bench-xla resnet50"
  "A|bench-xla sngan128|160|240|tools/accelerator/run.sh bench-xla sngan128"
  "A|bench-xla d4pg_pixels|100|200|tools/accelerator/run.sh bench-xla d4pg_pixels"
  "B|install|45|300|tools/accelerator/run.sh install && tools/accelerator/run.sh machine"
  "B|bench-cpu resnet|300|560|tools/accelerator/run.sh bench-cpu resnet"
  "B|bench-cpu sngan|300|560|tools/accelerator/run.sh bench-cpu sngan"
  "C|install|45|300|tools/accelerator/run.sh install && tools/accelerator/run.sh machine"
  "C|bench-cpu d4pg|300|560|tools/accelerator/run.sh bench-cpu d4pg"
)
START_S=60        # Machine start, counted (the tool says minutes; 30 s on 2026-11-26).
PART_S=15         # One call carrying one part (the tree too).
BUDGET_S=900      # A lent machine's 15 minutes, everything counted.

phase_limit() {   # NAME -> its time limit (s), from PHASES
  local entry; for entry in "${PHASES[@]}"; do
    IFS='|' read -r _ name _ limit _ <<< "$entry"
    [[ "$name" == "$1" ]] && { echo "$limit"; return; }
  done; echo 540
}

cmd_plan() {   # The device calls, in order, session by session, with the 15-minute budget.
  local n tree biggest=0
  if [[ -f "$ACCEL/MANIFEST" ]]; then
    n=$(awk '/^parts/ {print $2}' "$ACCEL/MANIFEST")
    biggest=$(( $(du -b "$ACCEL"/parts/*/chunk | sort -n | tail -1 | cut -f1) / 1048576 + 1 ))
  elif ((DRY)); then n=9; say "no pack yet: assuming $n parts (xz -$XZ_LEVEL of ~1.7 GB + 30 MB of data)"
  else say "no pack yet: run '$0 pack' first (or '$0 plan --dry-run')"; exit 1; fi
  tree=$(( $(tree_bytes) / 1048576 ))
  ((tree + biggest <= LIMIT_MIB)) || say "WARNING: tree $tree MiB + part $biggest MiB > $LIMIT_MIB MiB: pack again"
  echo "Device calls (the device tool's run), back to back: a warm machine keeps .accel/ for"
  echo "30 s after each call; if it went back, 'status' names the parts to carry again."
  echo "Tree $tree MiB + one part a call; $n parts. Each call's timeout_s: its limit + 30 s."
  local session
  for session in A B C; do
    echo
    case $session in
      A) echo "Session A (a lent machine's 15 minutes): the GPU half" ;;
      B) echo "Session B (the next lent machine's): the CPU scaling phase, ResNet and SN-GAN" ;;
      C) echo "Session C (the next one's, or what B leaves): the CPU scaling phase, D4PG" ;;
    esac
    printf '  %-4s %-60s %7s %7s %9s\n' "#" "call" "est. s" "limit" "at (min)"
    local t=$START_S i=0 d
    printf '  %-4s %-60s %7s %7s %9s\n' "-" "(machine start)" "$START_S" "-" "$(minutes $t)"
    for ((d = 0; d < n; d++)); do
      i=$((i + 1)); t=$((t + PART_S))
      printf '  %-4s %-60s %7s %7s %9s\n' "$i" "carry [\".accel/parts/$(printf %02d $d)\"]: run.sh status" "$PART_S" 60 "$(minutes $t)"
    done
    local entry s name est limit command
    for entry in "${PHASES[@]}"; do
      IFS='|' read -r s name est limit command <<< "$entry"
      [[ $s == "$session" ]] || continue
      i=$((i + 1)); t=$((t + est))
      printf '  %-4s %-60s %7s %7s %9s\n' "$i" "${command//tools\/accelerator\//}" "$est" "$limit" "$(minutes $t)"
    done
    echo "  Estimated $(minutes $t) of $((BUDGET_S / 60)) min.$( ((t > BUDGET_S)) && echo " OVER: stop at 15 min, keep the order; a cut phase keeps its finished rows.")"
  done
  echo
  echo "After each call: tools/accelerator/run.sh collect <files_at>. Every phase prints UTC"
  echo "timestamps at its start and end: compare them with the estimates above."
}

minutes() { awk "BEGIN {printf \"%.1f\", $1 / 60}"; }

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
  local f; for f in "${FMNIST_FILES[@]}"; do   # The CPU phase's data travelled too.
    cmp -s "$dir/.accel/datasets/fashion-mnist/$f" "$FMNIST_SRC/$f" || { say "datasets/fashion-mnist/$f did not travel intact"; exit 1; }
  done
  say "rehearsal passed: parts reassemble, checksums match, site unpacks ($got bytes), Fashion-MNIST's 4 files intact"
}

cmd_collect() {   # Here: a device call's returned files into results/accelerator/
  # (a bundle NAME.tar.gz unpacked into results/accelerator/NAME/).
  local from="$1" dest="$ROOT/results/accelerator"
  mkdir -p "$dest"
  for f in "$from"/*; do
    if [[ "$f" == *.tar.gz ]]; then
      local d="$dest/$(basename "$f" .tar.gz)"; run mkdir -p "$d"; run tar -C "$d" -xzf "$f"
      say "results/accelerator/$(basename "$d")/"
    else run cp "$f" "$dest/"; say "results/accelerator/$(basename "$f")"; fi
  done
  # Issue 41's goals, once the Keras peer or the compiled ResNet-50 rows are here
  # (stdlib only; exit 1 means a goal is not met or not measured: the table says which).
  if ((!DRY)) && [[ -f "$dest/keras-peer.json" || -d "$dest/xla-resnet50" ]]; then
    python3 "$ROOT/benchmarks/throughput/gpu_goals.py" --dir="$dest" > "$dest/goals.md" || true
    cat "$dest/goals.md"; say "results/accelerator/goals.md"
  fi
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
  begin install
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
  finish install
}

environment() {
  export PYTHONPATH="$ACCEL/site:$ROOT" LD_LIBRARY_PATH="$ACCEL/cuda12:${LD_LIBRARY_PATH:-}"
  export CUDA_CACHE_PATH="$ACCEL/cuda-cache" CUDA_CACHE_MAXSIZE=4294967296   # PTX JIT (sm_90)
  export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}" PYTHONUNBUFFERED=1
  # The carried Fashion-MNIST (replibench/data/fashion_mnist.py reads it from here).
  [[ -d "$ACCEL/datasets/fashion-mnist" ]] && export REPLIBENCH_FASHION_MNIST_DIR="$ACCEL/datasets/fashion-mnist"
  return 0
}

needs_install() {
  ((DRY)) && return 0
  [[ -n "${ACCEL_PYTHON:-}" ]] && return 0   # The ordinary path: a venv with TensorFlow.
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
    echo "CUDA libraries TensorFlow loads (.accel/cuda12 -> the image's):"; { ls -l "$ACCEL/cuda12" 2>/dev/null || echo "none (TensorFlow's own CUDA wheels)"; } | awk 'NR > 1 || /^none/ {print "  " ($9 ? $9 " -> " $11 : $0)}'
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

cmd_bench_gpu() {   # MODEL [PRECISIONS]: the throughput suite on the GPU, the default step
  needs_install; environment
  local py; py=$(device_python) model="${1:?model: resnet50, sngan128 or d4pg_pixels}"
  local precisions="${2:-float32,mixed_bfloat16,mixed_float16}" name="throughput-gpu-$model"
  [[ -n "${2:-}" ]] && name+="-${2//,/-}"
  mkdir -p "$(out)"; begin "bench-gpu $model"
  (cd "$ROOT" && run timeout 540 "$py" benchmarks/throughput/throughput.py --machine=gpu --models="$model" \
     --precisions="$precisions" --out="$(out)/$name" 2>&1 | tee "$(out)/$name.log")
  finish "bench-gpu $model"
}

cmd_keras_peer() {   # Keras' model.fit ResNet50, batch 256, bfloat16, jit_compile off and on
  needs_install; environment
  local py limit; py=$(device_python); limit=$(phase_limit keras-peer)
  mkdir -p "$(out)"; begin keras-peer
  (cd "$ROOT" && run timeout "$limit" "$py" benchmarks/throughput/keras_peer.py --precisions=mixed_bfloat16 \
     --jit=false,true --timeout=$((limit / 2)) --out="$(out)/keras-peer" 2>&1 | tee "$(out)/keras-peer.log") \
    || say "keras-peer stopped (exit $?); its finished rows are in $(out)/keras-peer.md"
  finish keras-peer
}

# Steps a row at the XLA phase: fewer than bench-gpu's (one device call holds 4 runs).
declare -A XLA_STEPS=([resnet50]=40 [sngan128]=30 [d4pg_pixels]=200)

cmd_bench_xla() {   # MODEL: bfloat16 and float16, without and with XLA; ResNet-50 profiled
  needs_install; environment
  local py; py=$(device_python) model="${1:?model: resnet50, sngan128 or d4pg_pixels}"
  local limit; limit=$(phase_limit "bench-xla $model")
  local profile=(); [[ "$model" == resnet50 ]] && profile=(--profile)
  # $OUT takes 8 files a call, 2 folders deep: the runs write to work/, and $OUT gets
  # the phase's summary (.md), its log and everything else as one .tar.gz (bundle).
  local work="$ACCEL/work/xla-$model"; run rm -rf "$work"; run mkdir -p "$work" "$(out)"
  begin "bench-xla $model"
  local jit t0=$SECONDS
  for jit in False True; do   # Uncompiled first: its rows are the default step's.
    local name="throughput-gpu-$model-xla-$jit" left=$((limit - 20 - (SECONDS - t0)))
    ((left > 30)) || { say "no time left for jit_compile=$jit"; break; }
    (cd "$ROOT" && run timeout "$left" "$py" benchmarks/throughput/throughput.py --machine=gpu \
       --models="$model" --precisions=mixed_bfloat16,mixed_float16 --steps="${XLA_STEPS[$model]}" \
       --gin_bindings="Experiment.jit_compile = $jit" "${profile[@]}" --out="$work/$name" \
       2>&1 | tee -a "$(out)/xla-$model.log") || say "jit_compile=$jit stopped (exit $?); its finished rows are kept"
  done
  bundle "$work" "xla-$model"
  finish "bench-xla $model"
}

bundle() {   # WORK NAME: NAME.md (WORK's tables and top ops) and NAME.tar.gz (all of WORK) in $OUT
  local work="$1" name="$2" f
  ((DRY)) && { echo "+ bundle $work -> $(out)/$name.md, $(out)/$name.tar.gz (no .xplane.pb if over 15 MiB)"; return; }
  {
    echo "# $name ($(date -u +%FT%TZ))"; echo
    for f in "$work"/*.md; do [[ -f "$f" ]] && { echo "## $(basename "$f" .md)"; echo; cat "$f"; echo; }; done
    while IFS= read -r f; do
      echo "## Top ops: ${f#$work/}"; echo; cat "$f"; echo
    done < <(find "$work" -name top_ops.md | sort)
  } > "$(out)/$name.md"
  tar -C "$work" -czf "$(out)/$name.tar.gz" --exclude=checkpoints .
  if (( $(stat -c %s "$(out)/$name.tar.gz") > 15 * 1048576 )); then   # The traces: 16 MiB a file back.
    say "$name.tar.gz is over 15 MiB: bundled without the .xplane.pb traces (their top ops are in it)"
    tar -C "$work" -czf "$(out)/$name.tar.gz" --exclude=checkpoints --exclude='*.xplane.pb' \
      --exclude='*.op_stats.pb' .
  fi
  say "wrote $(out)/$name.md and $name.tar.gz ($(( $(stat -c %s "$(out)/$name.tar.gz") / 1024 )) KiB)"
}

cmd_bench_cpu() {   # [WORKLOADS]: 1, 2, 4 and 8 worker processes, 2 cores each, on 16 cores
  needs_install; environment
  local py; py=$(device_python) workloads="${1:-resnet,sngan,d4pg}"
  local limit; limit=$(phase_limit "bench-cpu $workloads")
  if ((!DRY)) && [[ -z "${REPLIBENCH_FASHION_MNIST_DIR:-}" && ! -f "$FMNIST_SRC/${FMNIST_FILES[0]}" ]]; then
    say "no Fashion-MNIST: neither carried ($ACCEL/datasets) nor in $FMNIST_SRC"; exit 1
  fi
  # D4PG alone: each 2-core worker's actors on a core of their own, the learner on the
  # other (D4PG.actor_cores; issue 44: the learner scaling with its actors apart).
  local extra=(); [[ "$workloads" == d4pg ]] && extra=(--gin_bindings="D4PG.actor_cores = 1")
  mkdir -p "$(out)"; begin "bench-cpu $workloads"
  (cd "$ROOT" && CUDA_VISIBLE_DEVICES= run timeout "$limit" "$py" benchmarks/scaling/scaling.py \
     --workloads="$workloads" --worker_counts=1,2,4,8 --cpus_per_worker=2 --rounds=1 \
     "${extra[@]}" 2>&1 | tee "$(out)/scaling-cpu-${workloads//,/-}.txt") || say "bench-cpu stopped (exit $?)"
  finish "bench-cpu $workloads"
}

cmd_all() {   # Every phase after install, in the budget's order (the ordinary path; --dry-run)
  local entry name rest
  for entry in "${PHASES[@]}"; do
    IFS='|' read -r session name _ _ _ <<< "$entry"
    [[ $session != A && $name == install ]] && continue   # Once is enough on one machine.
    [[ "$name" == install ]] && { ((DRY)) && cmd_install; [[ -n "${ACCEL_PYTHON:-}" ]] || ((DRY)) || needs_install; cmd_machine; continue; }
    rest="${name#* }"; [[ "$rest" == "$name" ]] && rest=""
    case "$name" in
      keras-peer) cmd_keras_peer ;;
      bench-xla*) cmd_bench_xla "$rest" ;;
      bench-cpu*) cmd_bench_cpu "$rest" ;;
    esac
  done
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
  keras-peer) cmd_keras_peer ;;
  bench-gpu) shift; cmd_bench_gpu "$@" ;;
  bench-xla) shift; cmd_bench_xla "$@" ;;
  bench-cpu) shift; cmd_bench_cpu "$@" ;;
  all) cmd_all ;;
  *) sed -n '2,36p' "$0"; exit 2 ;;
esac
