"""Model parallelism on this machine: memory and step time against M, the pipeline's
bubble against micro-batches, bytes on each axis, and a model that only fits split.

Every configuration is the ResNet of configs/resnet/model_parallel_fit.gin (widths
64-128-256, two blocks a stage, 2.8M parameters, global batch 16) on one data-parallel
replica (topology.Mesh.data = 1) of M devices:

  sweep      tensor-parallel and pipelined (4 micro-batches) at M = 1, 2, 4: examples/s
             over the training calls after the first (a `replibench run` with
             --max_steps, read back from result.json), the largest device's bytes as
             the run placed them (parameters, optimizer state, other state) with the
             activations its traced step keeps there (result.json communication
             .model_parallel), beside plan's figure for the same device, and each
             axis's bytes per step;
  bubble     the pipeline at M = 2 over 1, 2, 4, 8 micro-batches (global batch 32):
             step time against GPipe's ideal (n + K - 1) / n of the bubble-free time;
  fit        the fit config as it is (its model, 32 MB devices, enforced; at any
             --scale): M = 1 must be refused (exit 2) before training, M = 2 and 4
             must train.

Configurations run in rounds (all, then all again) and the median is reported.
Writes OUT/results.json, OUT/table.md and OUT/*.png (matplotlib).

  .venv/bin/python benchmarks/model_parallel/model_parallel.py --out results/model_parallel [--rounds 2]
  .venv/bin/python benchmarks/model_parallel/model_parallel.py --scale tiny --out /tmp/mp   # a check
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
FILES = ("configs/resnet/fashion_mnist.gin", "configs/resnet/model_parallel_fit.gin")
# Evaluation and checkpoints out of the way: only training calls are measured.
QUIET = ("Experiment.eval_every_epochs = 1000", "Experiment.checkpoint_every_epochs = 1000",
         "Experiment.train_epochs = 1000", "FashionMNIST.num_eval_examples = 1000")
SCALES = {   # name: (steps a run, extra bindings)
    "full": (40, ()),
    "tiny": (4, ("small_resnet.widths = (8, 16, 32)", "small_resnet.blocks_per_stage = (1, 1, 1)",
                 "FashionMNIST.num_train_examples = 2560")),
}
PIPELINE = ("topology.Mesh.parallelism = 'pipeline'", "ImageClassification.model = "
            "@model_parallel.pipelined", "model_parallel.pipelined.builder = @small_resnet",
            "model_parallel.pipelined.split = @resnet_pieces")


def bindings(kind: str, m: int, micro: int = 4, limit: bool = False, batch: int = 16) -> list:
  out = [f"topology.Mesh.model = {m}", f"Experiment.global_batch_size = {batch}"]
  if not limit:
    out.append("topology.Mesh.device_memory_bytes = 0")
  if kind == "pipeline":
    out += [*PIPELINE, f"topology.Mesh.micro_batches = {micro}"]
  return out


def _cli(*args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "replibench.cli", *args], cwd=REPO,
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})


def _flags(extra: list, scale: str | None) -> list:
  shrink = SCALES[scale][1] if scale else ()
  return [*(f"--gin_file={f}" for f in FILES),
          *(f"--gin_bindings={b}" for b in (*QUIET, *shrink, *extra))]


def run(extra: list, scale: str, model_as_configured: bool = False) -> dict:
  """One `replibench run` (of the scale's model, or the config's own): its result.json,
  or {'exit': code, 'error': message}."""
  with tempfile.TemporaryDirectory() as workdir:
    proc = _cli("run", *_flags(extra, None if model_as_configured else scale),
                f"--max_steps={SCALES[scale][0]}", f"--workdir={workdir}")
    path = os.path.join(workdir, "result.json")
    if proc.returncode or not os.path.exists(path):
      return {"exit": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:]}
    with open(path) as f:
      return json.load(f)


def plan(extra: list, scale: str) -> dict:
  proc = _cli("plan", "--json", *_flags(extra, scale))
  if proc.returncode:
    raise RuntimeError(f"plan {extra} failed:\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout)


def _row(result: dict, planned: dict) -> dict:
  """What one run measured, beside what plan said, for the largest device."""
  record = result["communication"]["model_parallel"]
  devices = record["device_memory_bytes"]
  largest = max(devices.values(), key=lambda r: r["total"])
  facts = planned["model_parallel"]
  return {"examples_per_s": result["examples_per_s"],
          "step_s": result["global_batch_size"] / result["examples_per_s"],
          "device": largest, "planned_max_device_bytes": facts["max_device_bytes"],
          "model_axis_bytes": record["model_axis"]["payload_bytes_per_step"],
          "data_axis_bytes": record["data_axis"]["payload_bytes_per_step"],
          "model_axis_collectives": record["model_axis"]["collectives_per_step"],
          "planned_model_axis_wire": facts["model_axis"]["wire_bytes_per_step"],
          "bubble_fraction": facts["bubble_fraction"]}


def _median_rows(rows: list[dict]) -> dict:
  out = dict(rows[-1])
  for key in ("examples_per_s", "step_s"):
    out[key] = statistics.median(r[key] for r in rows)
  return out


def measure(scale: str, rounds: int) -> dict:
  configs = {f"{kind} M={m}": bindings(kind, m) for kind in ("tensor", "pipeline")
             for m in (1, 2, 4)}
  configs.update({f"bubble n={n}": bindings("pipeline", 2, micro=n, batch=32)
                  for n in (1, 2, 4, 8)})
  plans = {label: plan(extra, scale) for label, extra in configs.items()}
  rows = {label: [] for label in configs}
  for r in range(rounds):
    for label, extra in configs.items():
      result = run(extra, scale)
      if "exit" in result:
        raise RuntimeError(f"{label} failed ({result['exit']}): {result['error']}")
      rows[label].append(_row(result, plans[label]))
      print(f"[round {r + 1}/{rounds}] {label}: {rows[label][-1]['examples_per_s']:.1f} ex/s",
            flush=True)
  fit = measure_fit(scale)
  return {"scale": scale, "rounds": rounds,
          "runs": {label: _median_rows(rs) for label, rs in rows.items()}, "fit": fit}


def measure_fit(scale: str) -> dict:
  """The fit config's own model and limit, at any scale: M = 1 must not fit."""
  found = {}
  for m in (1, 2, 4):
    r = run(bindings("tensor", m, limit=True), scale, model_as_configured=True)
    found[m] = ({"refused": r["exit"] == 2, "error": r["error"]} if "exit" in r else
                {"refused": False, "examples_per_s": r["examples_per_s"],
                 "device": max(r["communication"]["model_parallel"]["device_memory_bytes"]
                               .values(), key=lambda row: row["total"])})
  return found


def table(found: dict) -> str:
  mb = lambda b: f"{b / 1e6:.2f}"  # noqa: E731
  lines = ["| config | ex/s | step ms | largest device MB (params / optimizer / other / "
           "activations) | planned MB | model axis MB/step (collectives) | data axis MB/step |",
           "|---|---|---|---|---|---|---|"]
  for label, r in found["runs"].items():
    d = r["device"]
    lines.append(
        f"| {label} | {r['examples_per_s']:.1f} | {1e3 * r['step_s']:.1f} | {mb(d['total'])} "
        f"({mb(d['parameters'])} / {mb(d['optimizer'])} / {mb(d['other'])} / "
        f"{mb(d['activations'])}) | {mb(r['planned_max_device_bytes'])} | "
        f"{mb(r['model_axis_bytes'])} ({r['model_axis_collectives']:g}) | "
        f"{mb(r['data_axis_bytes'])} |")
  base = found["runs"]["bubble n=1"]["step_s"]
  lines += ["", "| micro-batches n | step ms | step / step(n=1) | ideal (n+K-1)/(nK) | "
            "bubble (K-1)/(n+K-1) |", "|---|---|---|---|---|"]
  for n in (1, 2, 4, 8):
    r = found["runs"][f"bubble n={n}"]
    lines.append(f"| {n} | {1e3 * r['step_s']:.1f} | {r['step_s'] / base:.2f} | "
                 f"{(n + 1) / (2 * n):.2f} | {r['bubble_fraction']:.2f} |")
  lines += ["", "| fit (32 MB devices) | outcome |", "|---|---|"]
  for m, r in found["fit"].items():
    outcome = (f"refused, exit 2: {' '.join(r['error'])[:160]}" if r.get("refused") else
               f"trained, {r['examples_per_s']:.1f} ex/s, largest device "
               f"{mb(r['device']['total'])} MB" if "examples_per_s" in r else f"failed: {r}")
    lines.append(f"| M = {m} | {outcome} |")
  return "\n".join(lines)


def plots(found: dict, out: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
  runs, ms = found["runs"], (1, 2, 4)
  fig, axes = pyplot.subplots(1, 3, figsize=(15, 4))
  colors = dict(zip(("parameters", "optimizer", "other", "activations"),
                    ("tab:blue", "tab:orange", "tab:green", "tab:red")))
  for kind, offset, hatch in (("tensor", -0.2, ""), ("pipeline", 0.2, "//")):
    bottom = [0.0] * 3
    for part, color in colors.items():
      values = [runs[f"{kind} M={m}"]["device"][part] / 1e6 for m in ms]
      axes[0].bar([i + offset for i in range(3)], values, 0.4, bottom=bottom, color=color,
                  hatch=hatch, label=part if kind == "tensor" else None)
      bottom = [b + v for b, v in zip(bottom, values)]
    axes[1].plot(ms, [1e3 * runs[f"{kind} M={m}"]["step_s"] for m in ms], "o-", label=kind)
    axes[2].plot(ms, [runs[f"{kind} M={m}"]["model_axis_bytes"] / 1e6 for m in ms], "o-",
                 label=f"{kind}: model axis")
  if found["scale"] == "full":   # The fit config's model: its devices' memory.
    axes[0].axhline(32, color="k", linestyle=":", label="device memory (fit config)")
  axes[0].set(xticks=range(3), xticklabels=[f"M={m}" for m in ms],
              ylabel="MB on the largest device",
              title="memory per device (left tensor, right pipeline, hatched)")
  axes[1].set(xlabel="devices per replica M", ylabel="ms per step", title="step time")
  axes[2].set(xlabel="devices per replica M", ylabel="MB per step", title="model-axis bytes")
  for ax in axes:
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "memory_and_step_time.png"), dpi=100)
  fig, ax = pyplot.subplots(figsize=(5, 4))
  ns = (1, 2, 4, 8)
  base = runs["bubble n=1"]["step_s"]
  ax.plot(ns, [runs[f"bubble n={n}"]["step_s"] / base for n in ns], "o-", label="measured")
  ax.plot(ns, [(n + 1) / (2 * n) for n in ns], "k:", label="GPipe ideal, K = 2")
  ax.set(xscale="log", xticks=ns, xticklabels=ns, xlabel="micro-batches n",
         ylabel="step time / step time at n = 1", title="pipeline bubble (K = 2)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out, "bubble.png"), dpi=100)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="results/model_parallel")
  parser.add_argument("--scale", choices=sorted(SCALES), default="full")
  parser.add_argument("--rounds", type=int, default=2)
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  found = measure(args.scale, args.rounds)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(found, f, indent=1)
  text = table(found)
  with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write(text + "\n")
  plots(found, args.out)
  print(text)


if __name__ == "__main__":
  main()
