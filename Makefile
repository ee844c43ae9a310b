# Two entry points do all the set-up: `make demo` and `make test`. Both create .venv when it is
# missing and install fxmobile into it (building its C++ operator library) first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fxmobile-installed
CSRC := $(shell find fxmobile -name '*.cpp' -o -name '*.h' 2>/dev/null)

.PHONY: demo test test-slow docs zoo zoo-quick fuzz-long install clean runtimes peers mutants

$(PY):
	$(PYTHON) -m venv $(VENV)

# Build requirements come from pyproject.toml (one place); the package is then built without
# isolation so the extension compiles against the torch that is installed in the venv.
$(STAMP): $(PY) pyproject.toml $(CSRC)
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' > $(VENV)/build-requirements.txt
	$(PY) -m pip install --quiet -r $(VENV)/build-requirements.txt
	$(PY) -m pip install --quiet --no-build-isolation -e '.[dev]'
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fxmobile optimize torchvision:mobilenet_v2 -o build/mobilenet_v2.ptl --latency

# The runtime tests (tests/test_runtime_*.py) run against .runtimes/ when `make runtimes` has
# installed it, and are skipped otherwise; pytest's header and summary say which. pytest runs
# every code block of the README and docs/pages too (tests/test_docs.py).
test: $(STAMP)
	$(PY) -m ruff check fxmobile tests model_zoo_checks benchmarks
	$(PY) -m mypy
	$(MAKE) docs
	$(PY) -m pytest

# The documentation site (docs/mkdocs.yml: the pages in docs/pages, the API reference from the
# docstrings) into build/docs; --strict fails on a broken link, anchor or page left out of the nav.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -f docs/mkdocs.yml

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

clean:
	rm -rf build *.egg-info $(VENV)
	find fxmobile -name '*.so' -delete

# The reference runtimes (docs/pages/runtimes.md): one venv per real torch release under
# .runtimes/ (torch-1.13.1, torch-2.12.1), pinned in fxmobile/runtime/install.py, which this runs
# by path with $(PYTHON) (3.10 or 3.11: torch 1.13.1 has no wheel for later Pythons). A finished
# venv has a stamp, so a second run does nothing; `make clean` leaves them (gigabytes).
# RUNTIMES_FLAGS=--if-room skips a venv the free disk cannot hold instead of failing (.ci/run).
runtimes:
	$(PYTHON) fxmobile/runtime/install.py $(RUNTIMES_FLAGS) .runtimes

# The benchmark's peers in venvs of their own under .runtimes/ (docs/pages/performance.md):
# ExecuTorch 1.5.1 with its XNNPACK delegate, which pins its own torch. Idempotent like
# `make runtimes`.
peers:
	$(PYTHON) fxmobile/runtime/install.py --peers .runtimes

# The differential fuzzer's long profile (the default profile runs in `make test`).
fuzz-long: $(STAMP)
	FXMOBILE_FUZZ_EXAMPLES=20000 $(PY) -m pytest tests/test_fuzz.py -q -p no:cacheprovider

# The model-zoo regression run (model_zoo_checks): every catalogue entry on the CPU, tables in
# model_zoo_checks/results; fails on a regression against model_zoo_checks/baseline.json.
# The classification zoo alone: make zoo ZOO_ARGS="--kind classification".
# After an intended change: make zoo ZOO_ARGS=--update-baseline, then commit the baseline.
zoo: $(STAMP)
	$(PY) -m model_zoo_checks --out model_zoo_checks/results --plot model_zoo_checks/results/speedup.png $(ZOO_ARGS)

# The quick subset (seconds; `make test` runs it too, as tests/test_zoo_runner.py).
zoo-quick: $(STAMP)
	$(PY) -m model_zoo_checks --quick $(ZOO_ARGS)

# Mutation testing (docs/pages/checking.md): mutmut, configured in pyproject.toml's
# [tool.mutmut], plants one small change at a time in fxmobile/passes, fxmobile/script, the
# backends' passes and the capture's checks beyond the example inputs, and runs the tests that
# called the changed function.
# One worker (the machine is shared). Results accumulate in mutants/: a second run retests only
# the functions that changed (delete mutants/ for a fresh run). MUTANTS='fxmobile.script.fuse_clamp*'
# runs some; `.venv/bin/mutmut show NAME` prints a mutant's diff, `mutmut results` the survivors.
# The score per module (tests/mutation_score.py) is over the mutants that ran.
MUTANTS ?=
mutants: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run --max-children 1 $(MUTANTS)
	$(PY) tests/mutation_score.py mutants
