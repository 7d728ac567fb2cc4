# The two quick-start commands: `make demo` and `make test` (each creates the venv first).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PATHOLOGY ?= cpu-preprocess

.PHONY: venv link engines llamacpp llamacpp-background demo test test-unit test-integration test-engines lint docs score calibrate bench clean

# The card's folders install as one package, `diagnose` (see pyproject's package-dir). The editable
# install is "strict": build/__editable__.*/diagnose/ holds a link to every source file, which mypy
# and every tool can follow (the default editable install is an import hook only Python sees).
STRICT := --config-settings editable_mode=strict

$(BIN)/diagnose: pyproject.toml
	$(PY) -m venv $(VENV)
	# the CPU build of torch first, from its exact version (a bare `torch` pulls a multi-GB CUDA build)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet 'setuptools>=68' wheel  # the build backend, for `make link`
	$(BIN)/python -m pip install --quiet -e '.[demo,dev]' $(STRICT)
	touch $@

# the link tree again (2 s): a module added since the install is linked in too
link: $(BIN)/diagnose
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . $(STRICT)

venv: link

# the engine lab's real engines, each in a venv of its own under .engines/ (vLLM's CPU build: ~4 min once)
ENGINES := $(or $(DIAGNOSE_ENGINES),.engines)
$(ENGINES)/vllm/bin/python: tests/engines/install_vllm.sh
	bash tests/engines/install_vllm.sh

# llama.cpp's two servers (llama-cpp-python's and the C++ llama-server) compile from source, ~9 min on 2 cores: the
# build starts in the background at the lowest CPU priority, before the vLLM install, so it overlaps that install
# and the tests; the live llama.cpp tests run last and wait for it (its log: .engines/llamacpp-lab.log). A build
# already running (the lock held) is left to finish; a finished one does nothing in a second.
llamacpp-background:
	@mkdir -p $(ENGINES)
	@DIAGNOSE_ENGINES=$(ENGINES) flock -n $(ENGINES)/llamacpp-lab.lock sh -c 'rm -f $(ENGINES)/llamacpp-lab.rc; \
	  nice -n 19 bash tests/engines/llamacpp_lab.sh > $(ENGINES)/llamacpp-lab.log 2>&1; \
	  echo $$? > $(ENGINES)/llamacpp-lab.rc' < /dev/null > /dev/null 2>&1 &

# the same, in the foreground (after a background build, if one runs)
llamacpp:
	@mkdir -p $(ENGINES)
	DIAGNOSE_ENGINES=$(ENGINES) flock $(ENGINES)/llamacpp-lab.lock bash tests/engines/llamacpp_lab.sh

engines: llamacpp-background $(ENGINES)/vllm/bin/python

demo: venv
	$(BIN)/diagnose demo --pathology $(PATHOLOGY)

test: llamacpp-background venv engines
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 tests

test-unit: venv
	$(BIN)/python -m pytest -q tests/unit

test-integration: venv
	$(BIN)/python -m pytest -q tests/integration

# live tests on real engines (vLLM's CPU build, llama.cpp's two servers): each pathology named from attach, log and
# scrape
test-engines: llamacpp-background venv engines
	$(BIN)/python -m pytest -q tests/engines

lint: venv
	$(BIN)/ruff check analyzer collectors rules reports dashboard examples benchmarks tests docs
	$(BIN)/mypy -p diagnose  # strict on every module: analyzer, collectors, rules, reports, dashboard, examples

docs: venv
	$(BIN)/python -m diagnose.rulesdoc docs

# the real-incident corpus (tests/data/incidents): accuracy, committed precision, coverage, top-3 and calibration
# error for train (the report model's fit data: in-sample) and validation (looked at after a change is done, never
# tuned to), the held-out set (scored only, never fitted or tuned), the OOM development set (dev_oom.jsonl, in no
# split) and the shared dev set too, and train again out of fold (the report model refitted without each case's
# fold: the figure a change is judged by while it is made); the reliability tables go to docs/calibration.md. Then the shared scorer's
# line (an undetermined verdict scores as wrong there) with train's failures.
score: venv
	$(BIN)/python tests/data/incidents/score.py tests/data/incidents/train.jsonl tests/data/incidents/validation.jsonl \
	  $(wildcard tests/data/incidents/heldout.jsonl) tests/data/incidents/dev_oom.jsonl ../shared/data/incidents/dev.jsonl \
	  --out-of-fold tests/data/incidents/train.jsonl --write-doc docs/calibration.md
	@echo "== the shared scorer, train (tests/data/incidents/train.jsonl)"
	@$(PY) ../shared/eval/score_incidents.py tests/data/incidents/train.jsonl --diagnose $(BIN)/diagnose --show-failures
	@echo "== the shared scorer, validation and dev"
	@$(PY) ../shared/eval/score_incidents.py tests/data/incidents/validation.jsonl --diagnose $(BIN)/diagnose
	@$(PY) ../shared/eval/score_incidents.py ../shared/data/incidents/dev.jsonl --diagnose $(BIN)/diagnose

# the calibrator (rules/calibration.json) refitted on the train split's out-of-fold answers (~2 min)
calibrate: venv
	$(BIN)/python -m diagnose.rules.calibration_fit

bench: venv
	$(BIN)/python benchmarks/attach_overhead.py

clean:
	rm -rf $(VENV) $(ENGINES) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
