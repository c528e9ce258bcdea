"""Issue 41's GPU goals, judged from a lent machine's files: compiled ResNet-50 against Keras.

    .venv/bin/python benchmarks/throughput/gpu_goals.py          # reads results/accelerator/
    .venv/bin/python benchmarks/throughput/gpu_goals.py --dir=DIR --json

The accelerator run's `keras-peer` phase writes `keras-peer.json` (Keras `model.fit`
ResNet50, with and without `jit_compile`) and its `bench-xla resnet50` phase
`xla-resnet50/throughput-gpu-resnet50-xla-{False,True}.json` (replibench's ResNet-50
v1.5, uncompiled and compiled); `tools/accelerator/run.sh collect` puts both in
results/accelerator/ and then runs this. It prints one line a goal (mixed_bfloat16,
batch 256, one GPU, images/s):

- compiled replibench / Keras `model.fit(jit_compile=True)`, measured on the same
  machine in the same session: at least 1.5;
- compiled replibench: at least 4,400 images/s (an H100/H200-class GPU);
- beyond: the fraction of MLPerf Training v3.0's per-GPU rate (about 7,010 images/s
  a GPU; results/accelerator/README.md cites it).

A row is compared only with a row of the same precision and batch, measured on a GPU;
anything else, or a missing or failed row, is said as "not measured" with the reason,
never as a figure. Exit 0 when every goal is met, 1 when one is not met or not measured,
2 when a file is unreadable.
"""

import argparse
import json
import os
import sys

PRECISION, BATCH = "mixed_bfloat16", 256
MIN_VS_KERAS = 1.5
MIN_IMAGES_PER_S = 4400.0
# MLPerf Training v3.0, closed, ResNet-50 v1.5, 8x H100 SXM5 (Dell XE9680, result
# 3.0-2053): tracked_stats 55,940-56,200 images/s for 8 GPUs over epochs 23-35 of
# mlcommons/training_results_v3.0 Dell/results/XE9680x8H100-SXM-80GB/resnet/result_0.txt.
MLPERF_PER_GPU = 56080.0 / 8


class Unreadable(Exception):
  """A file that exists but is not the JSON its phase writes."""


def _rows(path: str) -> list[dict] | None:
  """The file's "rows", None when the file is absent (the phase did not run)."""
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      rows = json.load(f)["rows"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise Unreadable(f"{path}: not the rows its phase writes ({e})") from e
  if not isinstance(rows, list):
    raise Unreadable(f"{path}: \"rows\" is not a list")
  return rows


def keras_row(rows: list[dict] | None, jit: bool) -> tuple[float | None, str]:
  """(images/s, how) of Keras' row at PRECISION, BATCH with jit_compile=jit, on a GPU."""
  if rows is None:
    return None, "keras-peer.json absent (the keras-peer phase did not run)"
  for r in rows:
    if r.get("precision") == PRECISION and r.get("jit_compile") is jit:
      if "error" in r:
        return None, f"Keras jit_compile={jit} failed: {str(r['error'])[-120:]}"
      if r.get("batch") != BATCH or "GPU" not in str(r.get("device", "")):
        return None, (f"Keras jit_compile={jit} ran at batch {r.get('batch')} on "
                      f"{r.get('device')}, not {BATCH} on a GPU")
      return float(r["images_per_s"]), f"Keras jit_compile={jit} on {r['device']}"
  return None, f"keras-peer.json has no {PRECISION} row with jit_compile={jit}"


def ours_row(rows: list[dict] | None, compiled: bool) -> tuple[float | None, str]:
  """(images/s, how) of replibench's ResNet-50 row at PRECISION, BATCH, one GPU."""
  name = f"throughput-gpu-resnet50-xla-{compiled}.json"
  if rows is None:
    return None, f"{name} absent (the bench-xla resnet50 phase did not run or was cut)"
  for r in rows:
    if (r.get("model"), r.get("precision"), r.get("setup")) == ("resnet50", PRECISION,
                                                                 "replicas=1"):
      if "bench_failure" in r or r.get("examples_per_s") is None:   # throughput.FAILED
        said = (str(r.get("bench_failure") or "no examples/s").splitlines() or [""])[-1]
        return None, f"{name}: the {PRECISION} row failed: {said[-120:]}"
      if r.get("global_batch") != BATCH or r.get("memory_kind") != "GPU":
        return None, (f"{name}: the row ran at batch {r.get('global_batch')} on "
                      f"{r.get('memory_kind')}, not {BATCH} on a GPU")
      return float(r["examples_per_s"]), f"replibench jit_compile={compiled}"
  return None, f"{name} has no {PRECISION} ResNet-50 row at one replica"


def judge(results_dir: str) -> list[dict]:
  """One dict a goal: name, target, measured (None if not measured), met, how."""
  keras = _rows(os.path.join(results_dir, "keras-peer.json"))
  xla_dir = os.path.join(results_dir, "xla-resnet50")
  ours = {c: _rows(os.path.join(xla_dir, f"throughput-gpu-resnet50-xla-{c}.json"))
          for c in (False, True)}
  compiled, how = ours_row(ours[True], True)
  peer, peer_how = keras_row(keras, True)
  goals = []
  ratio = compiled / peer if compiled and peer else None
  goals.append({"goal": "compiled / Keras jit_compile=True", "target": MIN_VS_KERAS,
                "measured": ratio, "met": ratio is not None and ratio >= MIN_VS_KERAS,
                "how": (f"{compiled:,.0f} / {peer:,.0f} images/s ({peer_how})" if ratio
                        else peer_how if compiled else how)})
  goals.append({"goal": "compiled images/s", "target": MIN_IMAGES_PER_S,
                "measured": compiled, "met": compiled is not None and compiled >= MIN_IMAGES_PER_S,
                "how": how})
  fraction = compiled / MLPERF_PER_GPU if compiled else None
  goals.append({"goal": "of MLPerf v3.0's per-GPU rate (beyond)", "target": None,
                "measured": fraction, "met": None, "how": f"{MLPERF_PER_GPU:,.0f} images/s a GPU"})
  # Context: both steps without XLA (today's default, and the Keras user's).
  context = {"context: replibench jit_compile=False": ours_row(ours[False], False),
             "context: Keras jit_compile=False": keras_row(keras, False)}
  for goal, (value, side_how) in context.items():
    goals.append({"goal": goal, "target": None, "measured": value, "met": None, "how": side_how})
  return goals


def render(goals: list[dict]) -> str:
  lines = [f"# Issue 41's GPU goals: ResNet-50 {PRECISION}, batch {BATCH}, one GPU", "",
           "| goal | target | measured | verdict | from |", "|---|---|---|---|---|"]
  for g in goals:
    m = g["measured"]
    shown = "-" if m is None else (f"{m:.2f}" if m < 100 else f"{m:,.0f}")
    target = "-" if g["target"] is None else (f">= {g['target']:g}" if g["target"] < 100
                                              else f">= {g['target']:,.0f}")
    verdict = ("not measured" if m is None else "-" if g["met"] is None
               else "met" if g["met"] else "NOT met")
    lines.append(f"| {g['goal']} | {target} | {shown} | {verdict} | {g['how']} |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dir", default="results/accelerator",
                      help="where run.sh collect put the lent machine's files")
  parser.add_argument("--json", action="store_true", help="print the goals as JSON")
  args = parser.parse_args()
  try:
    goals = judge(args.dir)
  except Unreadable as e:
    print(f"gpu_goals.py: {e}. Collect the phase's files again (tools/accelerator/run.sh "
          f"collect FILES_AT) or remove the file; nothing was judged.", file=sys.stderr)
    return 2
  print(json.dumps(goals, indent=1) if args.json else render(goals))
  return 0 if all(g["met"] for g in goals if g["target"] is not None) else 1


if __name__ == "__main__":
  sys.exit(main())
