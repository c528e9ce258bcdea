# replibench: `make bench` runs the scaling suite, `make test` the tests.
# Both create .venv at the repo root and install what they need on first use.
# Timings are given only where measured, with the machine; the docs site has the rest
# (make docs; docs/get-started.md, docs/reference/tests-and-benchmarks.md).
#
#   make test-quick        the tests without clusters, SLURM or full runs (tests/tiers.py), for the edit-test loop
#   make bench             every workload's CPU-scale suite, judged against results/<suite>/baseline.json (888 s on the 2-core Zen 4 EPYC, 2026-11-27)
#   make bench-smoke       the same at tiny scale, against results/<suite>/smoke_baseline.json
#   make bench-resnet      one workload's suite (also bench-sngan, bench-d4pg; bench-smoke-resnet ...)
#   make bench-accept      make the latest suite results the committed baselines
#   make bench-resnet-full the headline single run: ResNet to 92% (time to target 650.6 s on the 2-core AVX2 EPYC, 2026-11-22)
#   make bench-engine      engine overhead against a hand-written tf.distribute loop
#   make bench-scaling     1 vs 2 worker processes, 1/2/4 logical replicas, init, collectives (SCALING_ARGS=...)
#   make bench-overlap     2 workers on an emulated link, with and without gradient buckets (root: tc; OVERLAP_ARGS=--profile)
#   make bench-ab BASE=REV A/B of REV against HEAD on this machine (SUITE=, HEAD=, AA=1, RECORD=1, PROBE=K; 25.6 min for an A/A on the 2-core Zen 4, 2026-11-26)
#   make history           the results history's HTML dashboard with change points (runs/history/)
#   make bench-throughput  the full-size models on synthetic data (results/throughput/; THROUGHPUT_ARGS=...)
#   make bench-accelerator on a GPU machine: tools/accelerator/run.sh all into results/latest/accelerator/
#   make bench-compile     graph vs XLA (Experiment.jit_compile), paired, into results/compile/ (COMPILE_ARGS=...)
#   make bench-model-parallel  memory and step time against the devices a replica spans (results/model_parallel/)
#   make tensorboard       TensorBoard on runs/ (WORKDIR=...), 127.0.0.1:6006
#   make docs              regenerate the reference pages (docs-reference), build the docs site into site/
#   make docs-serve        serve the docs site on 127.0.0.1:8000
#   make docs-reference    regenerate docs/reference/{cli,gin,result-json}.md from the code
# A bench writes its runs to runs/bench-<BENCH_ID>/ (BENCH_ID is a timestamp);
# `make bench BENCH_ID=<id>` resumes an interrupted one, skipping finished trials.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
RB := $(VENV)/bin/replibench
WORKDIR ?= runs
ifndef BENCH_ID
BENCH_ID := $(shell date +%Y%m%d-%H%M%S)
endif
BENCH_SUITES := resnet sngan d4pg
SWEEP_resnet := configs/resnet/scaling.sweep
SWEEP_sngan := configs/sngan/batch_scaling.sweep
SWEEP_d4pg := configs/d4pg/learner_scaling.sweep
# What each suite judges is in its sweep file (`judge`); compare gives no verdict on one
# seed against one seed. Minimum effect sizes above what unchanged code moves between
# `make bench` runs on one shared 2-core AVX-512 EPYC VM (measured 2026-11-24, fresh clones of
# one commit against its own baseline): suite means of time to target up to +25%,
# examples/s up to -15%, as the VM's speed drifts (its calibration moved 14-40%). A
# deliberate 1.8x slowdown moved them +56% to +84% and -43% to -55%. An SN-GAN reaches
# FID 155 at step 60, 80 or 100 (eval every 20): steps need a 50% effect.
MACHINE_FACTORS := time_to_target_s=0.35,examples_per_s=0.25
FACTORS_resnet := --factors=$(MACHINE_FACTORS)
FACTORS_sngan := --factors=$(MACHINE_FACTORS),steps_to_target=0.5
# D4PG's steps to target move with the seed's and the actors' timing, in evaluations of
# 250 learner steps (learner_scaling.sweep): a 50% effect, as SN-GAN's.
FACTORS_d4pg := --factors=$(MACHINE_FACTORS),steps_to_target=0.5
# Smoke runs last seconds: their times are start-up noise and their metrics those of
# toy models, so bench-smoke judges only that every trial still converges.
FACTORS_SMOKE := --judge=converged

.PHONY: all install slurm data test test-quick bench bench-smoke bench-accept bench-resnet-full bench-engine bench-scaling \
	bench-overlap \
	bench-ab history bench-throughput bench-accelerator bench-compile \
	bench-model-parallel \
	tensorboard docs docs-serve docs-reference clean $(addprefix bench-,$(BENCH_SUITES)) $(addprefix bench-smoke-,$(BENCH_SUITES))

all: test

# Apache Otava's E-divisive change points (replibench history) without its declared
# requirements: they pin numpy 2.2 and scipy < 1.17 and pull BigQuery, Slack and Postgres
# clients for its command line; its analysis module needs only numpy and scipy.
OTAVA := apache-otava==0.8.0

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(OTAVA)
	touch $(STAMP)

install: $(STAMP) slurm

# Debian's SLURM (slurmctld, slurmd, munge) for the tests that run a real one-node SLURM
# (tests/slurm_local.py starts and stops its daemons); only as root with apt-get, and
# best effort: without it those tests are skipped, with the reason shown.
SLURM_DEBS := slurmctld slurmd slurm-client munge
slurm:
	@if ! command -v slurmctld >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(SLURM_DEBS)) \
	  || echo "make slurm: could not install $(SLURM_DEBS); the SLURM tests will be skipped" >&2; \
	fi

# Fashion-MNIST from Debian, where we can; otherwise the loader falls back to TFDS.
data:
	@if [ ! -f $(FMNIST) ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	fi

# pytest exits 5 when it collected nothing: that must fail, not pass. The tests run in
# TEST_WORKERS processes (pytest-xdist): most of their time is single-threaded tracing;
# --dist worksteal: an idle worker takes queued tests from the other. Measured (the
# history: docs/reference/tests-and-benchmarks.md), fresh clones, alone: 1121 passed, 9
# skipped in 508.4 s of pytest on the 2-core Zen 5 EPYC (2026-12-05); on the 2-core Zen 4
# EPYC 767.7-802.8 s at 680313e (2026-12-06), 682.5-767.7 s (five runs, mean 720.8 s)
# after ml_dtypes < 0.7 and the tests' short calibration, 660.0-766.4 s (five runs,
# mean 691.8 s; over 720 s in one) with the engine's code left unconverted by AutoGraph
# (2026-12-07; test-quick 120.2 s), 593.4-762.9 s (five runs, mean 648.5 s; over 720 s
# in one, the VM 18% slower that hour) with conftest's full garbage collections cut from
# 87 to 12 (2026-12-07; test-quick 111.9 s); 596.2-604.4 s (two runs alternated with
# the previous main's 582.7-587.4 s) with tf.custom_gradient's registrations dropped,
# memory at peak 5.1-5.3 GiB against 8.4-8.5 (2026-12-07; test-quick 97.1 s).
TEST_WORKERS ?= 2
test: install data
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The edit-test loop: every test but the modules of tests/tiers.py (clusters, SLURM, full
# runs: marker `full`). make test (CI) stays the whole suite.
test-quick: install data
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not full" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-quick: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Each suite: sweep, report, compare. A failed trial or a regression fails the
# target, but the report and the comparison are still printed, and `make bench`
# goes on with the other suites before failing. The full bench ($(7) = history) also
# compares with this machine's newest history entry on the main line (informative: across
# time a shared machine drifts; `make bench-ab` decides) and appends its trials that ran
# to a result to it (a failed trial is named and left out, and fails the target). The
# history's own files never make the tree dirty (replibench/dirty.py), so a bench run
# after an A/B that appended to them is still recorded.
define run_suite
	@rc=0; start=$$(date +%s); \
	$(RB) sweep --sweep=$(SWEEP_$(1)) --workdir=$(2)/$(1) $(3) || rc=1; \
	$(RB) report $(2)/$(1) --out=$(4)/$(1) || exit 1; \
	if [ -f results/$(1)/$(5) ]; then \
	  $(RB) compare $(4)/$(1)/report.json --baseline=results/$(1)/$(5) $(6) || rc=1; \
	else echo "no committed baseline results/$(1)/$(5) yet: see make bench-accept"; fi; \
	if [ "$(7)" = history ]; then \
	  $(RB) history compare $(2)/$(1) --suite=$(1) $(6) || rc=1; \
	  $(RB) history record $(2)/$(1) --suite=$(1) || rc=1; fi; \
	echo "bench $(1): $$(( $$(date +%s) - start )) s, runs in $(2)/$(1), report in $(4)/$(1)"; \
	exit $$rc
endef

bench: install data
	@rc=0; for w in $(BENCH_SUITES); do \
	  $(MAKE) --no-print-directory bench-$$w BENCH_ID=$(BENCH_ID) || rc=1; done; exit $$rc

$(addprefix bench-,$(BENCH_SUITES)): bench-%: install data
	$(call run_suite,$*,$(WORKDIR)/bench-$(BENCH_ID),,results/latest,baseline.json,$(FACTORS_$*),history)

bench-smoke: install data
	@rc=0; for w in $(BENCH_SUITES); do \
	  $(MAKE) --no-print-directory bench-smoke-$$w BENCH_ID=$(BENCH_ID) || rc=1; done; exit $$rc

$(addprefix bench-smoke-,$(BENCH_SUITES)): bench-smoke-%: install data
	$(call run_suite,$*,$(WORKDIR)/bench-smoke-$(BENCH_ID),--seeds=1 --gin_bindings="include 'configs/$*/smoke.gin'",results/latest-smoke,smoke_baseline.json,$(FACTORS_SMOKE))

# After an intended change in performance: the latest suite results become the
# committed baselines (review and commit results/ afterwards).
bench-accept:
	@for w in $(BENCH_SUITES); do \
	  for kind in latest:baseline latest-smoke:smoke_baseline; do \
	    src=results/$${kind%%:*}/$$w; dst=$${kind##*:}; \
	    if [ -f $$src/report.json ]; then mkdir -p results/$$w; \
	      cp $$src/report.json results/$$w/$$dst.json; \
	      if [ $$dst = baseline ]; then cp $$src/report.md $$src/*.png results/$$w/ 2>/dev/null || true; fi; \
	      echo "results/$$w/$$dst.json <- $$src/report.json"; fi; done; done

# A/B against BASE (default: the merge base with main, or HEAD~1 on main) on this machine:
# both revisions checked out under runs/ab/worktrees/, trials interleaved (ABBA), paired
# ratios with confidence intervals; report in runs/ab/<time>-<base>-<head>/. 30 min at most
# for all three suites on a 2-core machine (results/tracking/README.md).
SUITE ?= all
bench-ab: install data
	$(RB) ab --suite=$(SUITE) $(if $(BASE),--base=$(BASE)) $(if $(HEAD),--head=$(HEAD)) \
	  $(if $(AA),--aa) $(if $(RECORD),--record) $(if $(PROBE),--probe_processes=$(PROBE))

history: install
	$(RB) history --out=$(WORKDIR)/history

bench-resnet-full: install data
	$(RB) run --gin_file=configs/resnet/fashion_mnist.gin --workdir=$(WORKDIR)/resnet-full-$(BENCH_ID)

bench-engine: install
	$(PY) benchmarks/scaling/engine_overhead.py

# The distributed path's scaling, every workload, from one run (issue-12 goals).
bench-scaling: install data
	$(PY) benchmarks/scaling/scaling.py $(SCALING_ARGS)

# Gradient buckets (regimes.Sync.bucket_bytes) against the link's rate, 2 workers (issue 42):
# results/scaling/overlap-resnet.{txt,json} (with OVERLAP_ARGS=--profile:
# overlap-resnet-profile.{txt,json}, the traces in runs/overlap-profiles/<time>/).
bench-overlap: install data
	$(PY) benchmarks/scaling/overlap.py $(OVERLAP_ARGS)

# The accelerator run's phases with this venv's Python (the ordinary path; the lent
# machine without a package index carries a bundle instead: tools/accelerator/run.sh plan).
bench-accelerator: install data
	ACCEL_PYTHON=$(abspath $(PY)) OUT=$(CURDIR)/results/latest/accelerator tools/accelerator/run.sh all

# The paper's models at full size on synthetic data (issue 36): replicas=1/2 and workers=1/2,
# float32 and bfloat16, each model at a fixed batch a device; THROUGHPUT_ARGS adds flags
# (e.g. --machine=gpu, --scale=tiny, --dry_run). Not yet timed on a quiet 2-core EPYC
# (an estimate: 45 min); results/throughput/README.md.
bench-throughput: install
	$(PY) benchmarks/throughput/throughput.py $(THROUGHPUT_ARGS)

# Graph vs XLA (issue 41, Experiment.jit_compile): bench-throughput's trials and the suites'
# smoke configs to target, each as ABBA pairs, into results/compile/ (the verdicts for
# CPU_DEFAULTS in replibench/config/compile_choice.py). COMPILE_ARGS adds flags (e.g.
# --scale=tiny, --rounds=5, --skip_target, --dry_run). Not yet timed on a quiet machine.
bench-compile: install data
	$(PY) benchmarks/compile/compile.py $(COMPILE_ARGS)

# Model parallelism (issue 35): figures, tables and plots into results/model_parallel/.
bench-model-parallel: install data
	$(PY) benchmarks/model_parallel/model_parallel.py --out results/model_parallel

tensorboard: install
	$(VENV)/bin/tensorboard --logdir=$(WORKDIR) --host=127.0.0.1

# The docs site (MkDocs, Material for MkDocs, mkdocstrings: pyproject's dev extra;
# mkdocs.yml, docs/, tools/docs/). Nothing is fetched from the network to build or view it.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs-reference: install
	$(PY) tools/docs/gen_reference.py

docs: docs-reference
	$(MKDOCS) build --strict

docs-serve: docs-reference
	$(MKDOCS) serve --strict --dev-addr=127.0.0.1:8000

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache site
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
