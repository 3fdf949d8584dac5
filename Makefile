# keybias: `make all` regenerates every result and paper/main.pdf; `make test` runs the tests.
# What reruns is decided by content hashes (src/keybias/pipeline/steps.py), never by file times.
SHELL := /bin/bash
.DELETE_ON_ERROR:
.DEFAULT_GOAL := all

PROFILE ?= paper
DEVICE ?= cpu
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TEX_PACKAGES := latexmk texlive-latex-base texlive-latex-recommended texlive-fonts-recommended
LOCK_HASH := $(shell cat requirements.lock scripts/torchvision_without_ops.py | sha256sum | cut -c1-16)
VENV_STAMP := $(VENV)/.installed-$(LOCK_HASH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
PIPELINE := $(PY) -m keybias.pipeline.steps --profile $(PROFILE) --device $(DEVICE)

# Refuse unknown PROFILE/DEVICE at once, before the venv or anything else is built.
ifeq ($(wildcard params/$(PROFILE).yaml),)
$(error PROFILE=$(PROFILE) is unknown; allowed: $(basename $(notdir $(wildcard params/*.yaml))))
endif
ifeq ($(filter $(DEVICE),cpu cuda mps auto),)
$(error DEVICE=$(DEVICE) is unknown; allowed: cpu cuda mps auto)
endif

.PHONY: install-check all notebooks paper test bench bench-surgery bundle verify verify-record arxiv bitwise clean help venv tex browser mutations manifest render gpu upstream longrun-full

# The pipeline prints one line per step; cell logs go to results/.build/logs/.
all: $(VENV_STAMP) ## regenerate results/, rendered notebooks and paper/main.pdf
	@TEX_PACKAGES="$(TEX_PACKAGES)" $(PIPELINE) all

notebooks: $(VENV_STAMP) ## run the notebooks only (no paper)
	@$(PIPELINE) notebooks

paper: $(VENV_STAMP) ## check the claims, then build paper/main.pdf from results/
	@TEX_PACKAGES="$(TEX_PACKAGES)" $(PIPELINE) paper

test: $(VENV_STAMP) ## ruff, unit tests, smoke runs of every notebook, environment checks
	$(PY) -m ruff check src tests notebooks
	$(PY) -m pytest

install-check: $(VENV_STAMP) ## build the wheel, install it into a fresh venv with the core dependencies only, try the tool
	$(PY) -m pytest -m install -s tests/integration/test_install.py

bench: $(VENV_STAMP) ## the full timing sweep of the cost benchmark (long)
	$(PY) -m keybias.studies.cost.bench --full --device $(DEVICE) --out results/machine

# upstream/: the fix for torch's F.multi_head_attention_forward (is_causal with appended key slots, static_k).
upstream: $(VENV_STAMP) ## the PyTorch fix in upstream/: its test fails on stock torch and passes patched (exit 0 only then)
	@$(PY) upstream/check.py

LONGRUN_OUT ?= recorded/longrun-cpu
longrun-full: $(VENV_STAMP) ## notebook 08's full grid (3 seeds x 2 sizes x 3 Adam regimes, ~25 min) into $(LONGRUN_OUT); commit the code first
	$(PY) -m keybias.studies.longrun.record --out $(LONGRUN_OUT) --commit $$(git rev-parse HEAD) --workers 2

bench-surgery: $(VENV_STAMP) ## time and peak memory of the surgery tool at 110M, 355M, 1.3B and 6.7B parameters (about half an hour, ~30 GB of scratch disk; writes results/machine/surgery_bench.{csv,md}, machine outputs)
	$(PY) scripts/bench_surgery.py --out results/machine

GPU_OUT ?= recorded/gpu-local
gpu: $(VENV_STAMP) ## on a CUDA machine: the GPU profile into $(GPU_OUT), for notebook 09 to judge (recorded=...)
	$(PY) -m keybias.studies.gpu.measure --out $(GPU_OUT) --commit $$(git rev-parse HEAD)

bundle: $(VENV_STAMP) ## deterministic dist/keybias-artifact-<commit>.tar.gz of HEAD (refuses a dirty tree)
	@$(PY) -m keybias.pipeline.steps bundle

verify: $(VENV_STAMP) ## regenerate into a scratch folder; compare findings, exact data and rounding statistics with results/ (writes nothing here)
	@$(PIPELINE) verify

verify-record: $(VENV_STAMP) ## as verify, and keep its record (machine, times, outcome) in results/machine/verify.json
	@$(PIPELINE) verify --record

arxiv: $(VENV_STAMP) ## dist/keybias-arxiv-<commit>.tar.gz, proven by compiling it with pdflatex alone
	@TEX_PACKAGES="$(TEX_PACKAGES)" $(PIPELINE) arxiv

bitwise: $(VENV_STAMP) ## measure whether results are byte-identical across CPU instruction sets
	@$(PY) -m keybias.studies.bitwise --threads 2 --out results/machine/bitwise.json

mutations: $(VENV_STAMP) ## run the mutation tests: every test claim, its mutations and their distance from the bound; fails if one has none
	@$(PY) -m keybias.pipeline.claims mutations --profile $(PROFILE)

manifest: $(VENV_STAMP) ## rewrite params/claims/$(PROFILE)/ from the claims in results/ (after adding a claim)
	@$(PY) -m keybias.pipeline.claims manifest --profile $(PROFILE) --results results --write

# MathJax 3.2.2 (npm pack mathjax@3.2.2) is vendored in src/keybias/pipeline/assets/mathjax; checksums in its SOURCE.md.
render: $(VENV_STAMP) ## re-render results/notebooks/*.html from the executed notebooks (no kernel)
	@$(PY) -m keybias.pipeline.render --results results render

venv: $(VENV_STAMP) ## build .venv from requirements.lock (torchvision reinstalled without compiled ops beside a CPU torch)

$(VENV_STAMP):
	@echo "building $(VENV) from requirements.lock (pip output follows only on errors or warnings)"
	@rm -rf $(VENV)
	@$(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	@# PyPI's torchvision is a CUDA build: reinstall it without its compiled ops (see README, Install)
	@$(PY) scripts/torchvision_without_ops.py
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@$(PY) -m ipykernel install --prefix $(VENV) --name keybias --display-name "Python (keybias .venv)" >/dev/null
	@touch $@

tex: ## install the TeX packages if latexmk is missing (root on Debian/Ubuntu), else explain
	@if command -v latexmk >/dev/null && command -v pdflatex >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "latexmk missing: installing Debian packages $(TEX_PACKAGES)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEX_PACKAGES) >/dev/null; \
	else \
	  echo "error: latexmk/pdflatex not found. Install: sudo apt-get install $(TEX_PACKAGES)" >&2; exit 1; \
	fi

browser: ## install headless Chromium for the browser tests (root on Debian/Ubuntu), else skip them
	@if command -v chromium >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "chromium missing: installing the Debian package chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	else \
	  echo "chromium not found and not root: the browser tests will be skipped (sudo apt-get install chromium)"; \
	fi

clean: ## remove build stamps and scratch files (keeps results/ and .venv)
	rm -rf .build results/.build results/.staging paper/build

help: ## list targets and parameters
	@echo "targets:"; grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /  make \1\t/' | expand -t 20
	@echo "parameters:"
	@echo "  PROFILE=paper|smoke   parameter profile in params/ (default paper)"
	@echo "  DEVICE=cpu|cuda|mps|auto  device for device-dependent notebooks (default cpu)"
	@echo "  KEYBIAS_THREADS=N     intra-op threads of every notebook kernel (default 2; changes last bits)"
