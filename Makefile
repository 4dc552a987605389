# Every target does its own set-up, sized to it, in two idempotent steps that re-run only when pyproject.toml changes:
# `make setup` (demo, reproduce, lab) is the virtualenv, torch==2.13.0 first (this machine's pip serves a CPU build
# of 2.13.0; a newer or open range pulls CUDA wheels), then the package and its runtime dependencies; `make
# setup-dev` (test, lint, docs, bench) adds the dev extras (pytest, the peers' and MPI's wheels, MLflow with its
# server, mkdocs, Playwright). Each install names the torch pin again, so no extra can move torch.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: setup setup-dev setup-browser demo reproduce test test-slow test-all lint lab bench bench-gate docs clean

setup: $(STAMP)

setup-dev: $(DEV_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip >/dev/null
	$(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e . $(TORCH)
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -e '.[dev]' $(TORCH)
	touch $(DEV_STAMP)

# Debian's Chromium for tests/browser (Playwright, a dev extra, drives it; no browser download). Needs root and apt.
setup-browser: setup-dev
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

# A one-node Slurm cluster on this machine (tools/slurm_cluster.py says how): Debian's slurm-wlm and munge, then a
# slurm.conf for this machine's cores and memory as `slurmd -C` reads them, written to /etc/slurm/slurm.conf (never
# over one workbench did not write). Needs root and apt. cluster-up / cluster-down start and stop munged, slurmctld
# and slurmd (state, logs and pid files under /var/lib/workbench-slurm); tests/cluster starts a cluster of its own.
.PHONY: setup-cluster setup-netns cluster-up cluster-down
setup-cluster:
	command -v slurmctld >/dev/null && command -v munged >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge)
	python3 tools/slurm_cluster.py configure

# iproute2's ip for tests/test_multihost.py's two hosts (network namespaces joined by a veth pair; root).
setup-netns:
	command -v ip >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2)

cluster-up:
	python3 tools/slurm_cluster.py up

cluster-down:
	python3 tools/slurm_cluster.py down

# The paper workflow in a few minutes: every recovery strategy x 2 seeds on 4 ranks, MNIST-1D's MLP for 400 steps (the
# notebook's Adam, cosine, batch 100: an accepted workload, docs/workloads.md), under a failure
# process (exponential gaps of mean 80 steps, up to 3 failures: the ANL failure-simulation framework; rollback and
# forward also with regrow), then a small bit-flip campaign, then one HTML report whose trade-off figure shows
# overhead in % of the failure-free run on the clock the runs call for (rank-time: 4 ranks share the cores), marks
# the strategies whose world size changed and lists failed runs apart. Resumable: run it again and only unfinished points run. A failed point does not stop the
# demo (the report shows it).
DEMO ?= runs/demo
demo: setup
	-$(VENV)/bin/workbench sweep notebooks/permanent_faults.ipynb --out $(DEMO)/permanent_faults \
		--grid notebooks/demo_strategies.yaml -p seed 0 1 -p model mnist1d_mlp -p dataset mnist1d \
		-p world_size 4 -p steps 400 -p fault random:mtbf_steps=80,seed=1,max=3
	-$(VENV)/bin/workbench sweep notebooks/soft_errors.ipynb --out $(DEMO)/soft_errors -p flip_bit 30 22
	$(VENV)/bin/workbench report $(DEMO)/permanent_faults $(DEMO)/soft_errors --out $(DEMO)/report.html

# The seed papers' findings at the registered paper scale (workbench/campaigns/reproduce/registry.yaml: lenet5, vgg11 on
# synthetic_image, reporting seeds drawn when a campaign starts; one sweep point each; estimated ~115 min on 2
# idle cores, more than the 60-minute aim: docs/reproduce.md gives the times taken), then runs/reproduce/report.html
# with a verdict per registered finding. Each finished run prints a progress line (runs done / total, elapsed,
# estimated finish). Resumable: every run of a campaign is cached and keeps its seeds, and a
# second invocation re-runs only unfinished notebooks and runs. A finding that does not hold fails its notebook's last cell;
# the report is written anyway, then the target exits 1 when a finding does not hold or was not run.
REPRO ?= runs/reproduce
REPRODUCE_NOTEBOOKS = ccgrid22:ccgrid22_resilience jpdc24:jpdc24_soft_errors europmpi17:europmpi17_mpi_needs \
	gossipgrad:gossipgrad apoptosis:apoptosis
# the papers' second studies (registry.yaml, <paper>_study2), each run by its paper's campaign without a notebook
REPRODUCE_STUDIES = ccgrid22_study2
reproduce: setup
	$(PY) -m pip install -q -e '.[studies]' $(TORCH)
	@for pair in $(REPRODUCE_NOTEBOOKS); do key=$${pair%%:*}; nb=$${pair#*:}; \
		$(VENV)/bin/workbench sweep notebooks/reproduce/$$nb.ipynb --out $(REPRO)/$$key -p scale paper || true; \
	done
	@for key in $(REPRODUCE_STUDIES); do \
		$(PY) -m workbench.campaigns.reproduce.run_study $$key --out $(REPRO)/$$key || true; \
	done
	$(PY) -m workbench.campaigns.reproduce.report $(REPRO)

# The tests and every notebook (nbval) in pytest sessions over two workers (pytest-xdist): their waits for
# processes, kernels and timeouts overlap. tests/ci_guard.py schedules them: a notebook's cells in one worker (and
# kernel), tests/cluster's tests with their one Slurm cluster, every other test on its own; under CI=true a skip
# fails. tests/tiers.py splits the suite in two: `make test` runs the fast tier (within 10 minutes on 2 cores),
# `make test-slow` the tests listed in tests/slow.txt; CI (.ci/run) runs both, `make test-all` both in one session.
# tests/notebooks holds fixtures, not notebooks to check. --durations: to keep each tier within its budget.
PYTEST_SUITE = $(VENV)/bin/pytest -q -rs -n 2 --durations=15 --nbval-lax --ignore=tests/notebooks
test: setup-dev
	$(PYTEST_SUITE) -m "not slow" notebooks tests

test-slow: setup-dev
	$(PYTEST_SUITE) -m slow notebooks tests

test-all: setup-dev
	$(PYTEST_SUITE) notebooks tests

# ruff, then tools/check_structure.py: no import cycles in workbench/, no class spread over files (no mixin, no
# 'self: Any'), no function over 80 lines (unless its docstring says why in "One piece: ..."), no module over 1000
lint: setup-dev
	$(VENV)/bin/ruff check workbench tests benchmarks tools
	$(PY) tools/check_structure.py
	$(PY) tools/check_docstrings.py

lab: setup
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --no-browser notebooks

bench: setup-dev
	$(PY) benchmarks/bench_overhead.py
	$(PY) benchmarks/bench_sweep.py

# The speed gate (benchmarks/gate.py): the headline figures, each against a reference measured in the same run and
# within its budget; one JSON line per figure, appended to benchmarks/results/gate_history.jsonl; exit 1 on a miss.
# `.ci/run` runs it (<= 5 min on 2 cores). `$(PY) benchmarks/gate.py --table` writes the newest into the docs.
bench-gate: setup-dev
	$(PY) benchmarks/gate.py

# The documentation site (mkdocs-material; mkdocs.yml says why) into site/: offline, strict (a broken link or anchor
# fails the build). NO_MKDOCS_2_WARNING silences mkdocs-material's end-of-life banner, which is not a build warning.
docs: setup-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf runs .pytest_cache site
