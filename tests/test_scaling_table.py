"""benchmarks/scaling/scaling.py --worker_counts' markdown table: each count's speed-up, its
efficiency against N and against the machine's ceiling (results/scaling/README.md)."""

from benchmarks.scaling import scaling


def test_the_table_sets_each_count_beside_its_ceilings():
  eps = {"workers=1": 100, "workers=2": 160, "workers=2 (weak, 2x batch)": 180,
         "2 x workers=1, at once": 190, "2 x workers=1, batch/2, at once": 170,
         "workers=4": 300, "workers=4 (weak, 4x batch)": 340}
  rows = scaling.worker_table(scaling.WORKLOADS["resnet"],
                              {k: [{"examples_per_s": v}] for k, v in eps.items()}, [1, 2, 4])
  assert len(scaling.TABLE_HEAD[0].split("|")) == len(rows[0].split("|"))
  assert rows[0] == "| resnet | 2 | 1.60x | 80% | 1.70x | 94% | 1.80x | 90% | 1.90x | 95% |"
  # No ceiling measured for 4 workers: its cells say so.
  assert rows[1] == "| resnet | 4 | 3.00x | 75% | - | - | 3.40x | 85% | - | - |"
