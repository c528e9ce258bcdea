# replibench: `make bench` runs the main benchmark, `make test` the tests.
# Both create .venv at the repo root and install what they need on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
WORKDIR ?= runs
BENCH_CONFIG ?= configs/resnet/fashion_mnist.gin

.PHONY: all install data test bench bench-engine tensorboard clean

all: test

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST from Debian, where we can; otherwise the loader falls back to TFDS.
data:
	@if [ ! -f $(FMNIST) ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	fi

# pytest exits 5 when it collected nothing: that must fail, not pass.
test: install data
	@$(PY) -m pytest tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: install data
	$(VENV)/bin/replibench run --gin_file=$(BENCH_CONFIG) --workdir=$(WORKDIR)/bench-resnet-$$(date +%Y%m%d-%H%M%S)

bench-engine: install
	$(PY) benchmarks/engine_overhead.py

tensorboard: install
	$(VENV)/bin/tensorboard --logdir=$(WORKDIR) --host=127.0.0.1

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
