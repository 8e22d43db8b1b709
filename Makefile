# The two set-up commands of the README: `make demo` (a small study) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed first and explicitly: a CPU machine with the 2.13.0 CPU wheel on disk takes it,
# a GPU machine gets PyPI's CUDA build of the same release.
TORCH_VERSION ?= 2.13.0
# Two pytest-xdist workers: CI has 2 cores; tests that start Ray share one worker (tests/conftest.py).
TEST_WORKERS ?= 2
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: install demo test lint tree typecheck bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# `make demo` studies the lm family on its synthetic language (whose entropy rate is known): four
# budgets of 2-layer models, so that width grows with the budget (on a CPU, a few epochs are too few
# for deeper models to beat shallow ones: docs/guide.md, the lm family), searched with successive halving
# under a WSD schedule (6 planned trials a budget, the best third go on from epoch 1 to epoch 3).
# The PatchTST study of the design is one flag away: `make demo FAMILY=patchtst`.
FAMILY ?= lm
DEMO_FLAGS_lm := --family lm --data synthetic:tokens=100000 --budget 75K --budget 100K --budget 300K \
	--budget 400K --n-layers 2 --trials 6 --learning-rate 3e-3 --batch-size 16 --epochs 3 \
	--schedule wsd --pruner halving --min-fraction 1/3
DEMO_FLAGS_patchtst := --family patchtst --budget 100K --budget 200K --budget 400K --trials 6

demo: install
	$(if $(DEMO_FLAGS_$(FAMILY)),,$(error make demo: FAMILY must be lm or patchtst, not '$(FAMILY)'))
	$(VENV)/bin/archhpo run --experiment demo --quick --workers 2 --out results $(DEMO_FLAGS_$(FAMILY))

lint: install
	$(PY) -m ruff check archhpo budgets cluster models report search workers tests bench scripts

# The installed layout (archhpo.search, ...) as links, for mypy and editors (docs/development.md, Development):
# the folders are mapped by pyproject's package-dir, so the checkout itself has no archhpo/search/.
TREE := build/typecheck/archhpo
tree:
	rm -rf $(TREE) && mkdir -p $(TREE)
	ln -s $(CURDIR)/archhpo/*.py $(CURDIR)/archhpo/cli $(TREE)/
	for d in budgets cluster models report search workers; do ln -s $(CURDIR)/$$d $(TREE)/$$d; done

# Run from the tree's folder: in the checkout, its own archhpo/ would shadow the tree.
typecheck: install tree
	cd build/typecheck && $(CURDIR)/$(PY) -m mypy --config-file $(CURDIR)/pyproject.toml

test: install lint typecheck
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

bench: install
	$(PY) bench/trainer_throughput.py
	$(PY) bench/orchestration.py

clean:
	rm -rf $(VENV) results archhpo.db archhpo.db-* archhpo.db.lock
