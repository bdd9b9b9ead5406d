# twinbolt: `make demo` runs the experiment on the embedded lab; `make test`
# runs every test. Both set the machine up first if needed. `make help` lists
# every target.

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# The operator's tools (requirements.lock): no root, no lab.
VENV := .venv
PY := $(VENV)/bin/python
# The lab's and the developers' venv (requirements-lab.lock): the operator's
# tools plus the lab gateway's LiteLLM and sglang-router, the benchmarks'
# client and lint. The tests run here.
LAB_VENV := .venv-lab
LAB_PY := $(LAB_VENV)/bin/python
# python3-venv: the lab's gateway makes its own venvs, as a real gateway does.
APT_PACKAGES := openssh-server openssh-client systemd runit kmod iptables iproute2 iputils-ping \
	binutils gcc procps util-linux zstd xz-utils sudo python3-venv iperf3 haproxy
# The conformance tests' venvs (tests/conformance), one per SGLang release a
# requirements-sglang-VERSION.lock pins (serving.min_sglang_version and the newest
# supported): sglang without its dependencies (no torch, no CUDA), beside the few
# its argument parser imports (requirements-conformance.lock). uv installs them,
# not byte-compiled (the tests import a fraction of sglang): seconds, where pip
# took a minute.
SGLANG_VENVS := $(patsubst requirements-sglang-%.lock,.venv-sglang-%/.installed,\
	$(wildcard requirements-sglang-*.lock))
# The gateway's locks; the lab's gateway installs them from this wheelhouse,
# built once, so that a converge sends nothing to a package registry.
GATEWAY_LOCKS := requirements-litellm.lock requirements-router.lock
WHEELHOUSE := wheelhouse
# The demo's windows are short: it shows the experiment, it is not the campaign.
# Its long window is one cold prompt of two of SGLang's 2048-token prefill
# chunks, so that prefill's all-reduces cross the link in every demo; its
# profile window shows where each rank's time goes.
DEMO_WINDOWS := --window single --window concurrent --window long --window profile \
	--single-tokens 128 --concurrent-requests 4 --concurrent-tokens 64 --long-tokens 4096 \
	--long-output-tokens 16 --profile-tokens 32

.PHONY: help venv root packages setup lab lab-down demo test test-runit soak lint lock

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

venv: $(VENV)/.installed  ## the operator's tools only (pyinfra, testinfra, ...): no root, no lab

$(VENV)/.installed: requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r requirements.lock
	touch $@

$(LAB_VENV)/.installed: requirements-lab.lock
	test -x $(LAB_VENV)/bin/python || $(PYTHON) -m venv $(LAB_VENV)
	$(LAB_VENV)/bin/python -m pip install -q --require-hashes -r requirements-lab.lock
	touch $@

.venv-sglang-%/.installed: requirements-sglang-%.lock requirements-conformance.lock \
		$(LAB_VENV)/.installed
	test -x $(@D)/bin/python || $(LAB_VENV)/bin/uv venv -q --python $(PYTHON) $(@D)
	$(LAB_VENV)/bin/uv pip install -q --python $(@D)/bin/python --no-deps --require-hashes \
		-r requirements-sglang-$*.lock -r requirements-conformance.lock
	touch $@

setup: root packages venv $(LAB_VENV)/.installed $(SGLANG_VENVS) $(WHEELHOUSE)/.built  ## the lab's Debian packages (root), the venvs, the gateway's wheelhouse

# First of everything that needs the lab, so that an unprivileged run stops
# before it installs anything.
root:
	@if [ "$$(id -u)" != 0 ]; then \
		echo "twinbolt: the lab needs root: it makes network namespaces and mounts, and installs Debian packages." >&2; \
		echo "twinbolt: run this as root (sudo make $(or $(MAKECMDGOALS),demo)); for the operator's tools alone, without root or the lab, run: make venv" >&2; \
		exit 1; \
	fi

$(WHEELHOUSE)/.built: $(GATEWAY_LOCKS) $(LAB_VENV)/.installed
	$(LAB_PY) -m pip download -q --require-hashes --only-binary=:all: -d $(WHEELHOUSE) \
		$(addprefix -r ,$(GATEWAY_LOCKS))
	touch $@

packages:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "setup: installing Debian packages: $$missing"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

lab: root setup  ## start (or repair) the embedded lab
	$(PY) -m lab up
	$(PY) -m lab status

lab-down:  ## remove the lab: namespaces, links, processes
	$(PY) -m lab down

# Production converged and proven; then the campaign: the transport alone first
# (production under the candidate and under e2e=0, a linktest in each), then
# tp2_stock and tp2_e2e, one layer apart, each deployed, verified and measured in
# three trials (ABBA: stock, e2e, e2e, stock, stock, e2e), and production
# restored and verified whatever failed. The exit code says whether anything
# failed. Last, the compatibility ledger those runs wrote.
demo: root lab  ## the experiment on the lab: the link alone, then production, tp2_stock, tp2_e2e, compared, production
	$(VENV)/bin/pyinfra -y inventory.py deploy.py --data state=production
	$(VENV)/bin/pytest tests/verify --state production -q
	$(PY) experiment.py campaign --no-baseline --states tp2_stock,tp2_e2e --linktest-seconds 1 \
		--trials 3 $(DEMO_WINDOWS)
	$(PY) experiment.py matrix

# import-linter's contracts are pyproject.toml's [tool.importlinter]: the layers
# of operations/, the lab and the harness kept out of them. It reads the packages
# from the working directory (the repository root), and caches nothing.
lint: root setup  ## ruff, and the layering (import-linter)
	$(LAB_VENV)/bin/ruff check .
	$(LAB_VENV)/bin/lint-imports --no-cache

# Every test. Each kind of interruption is here once (tests/e2e/test_signals.py:
# SIGINT, SIGTERM and SIGKILL on the way to tp2_e2e, SIGINT on the way back);
# `make soak` sweeps them over many points of both legs.
# The lab's own tests go last: they take the lab down and rebuild it, which
# restarts every host (a rebuilt gateway keeps its venvs, as a disk would).
test: root setup lint  ## every test: conformance, unit, end-to-end, the lab's own, runit
	$(LAB_PY) -m pytest --durations=5 tests/conformance
	$(LAB_PY) -m pytest --durations=10 -n auto tests/unit
	$(PY) -m lab up
	$(LAB_PY) -m pytest --durations=20 tests/e2e
	$(LAB_PY) -m pytest --durations=5 tests/lab
	$(MAKE) test-runit

# The lab's hosts boot systemd; runit stays supported: a round trip and a
# rollback on hosts that boot it, then the lab back on systemd.
RUNIT_CASES := \
	tests/e2e/test_states_driver_link.py::test_production_to_tp2_e2e_and_back_each_verified \
	tests/e2e/test_gateway_rollback.py
test-runit: root setup  ## a round trip and a rollback on lab hosts that boot runit
	$(PY) -m lab up --init runit
	$(LAB_PY) -m pytest --durations=5 $(RUNIT_CASES)
	$(PY) -m lab up --init systemd

# Interrupt runs of production -> tp2_e2e -> production at SOAK_POINTS points per
# leg, with SIGINT, SIGTERM and SIGKILL: each signalled run must end in a verified
# production (or change nothing), and the run after each kill must converge and verify.
SOAK_POINTS ?= 2
soak: root lab  ## the interruption sweep (SOAK_POINTS per leg)
	$(PY) tests/soak/interrupt.py --points $(SOAK_POINTS)

lock: $(LAB_VENV)/.installed  ## re-pin every requirement set, with hashes
	for set in requirements requirements-lab requirements-conformance; do \
		$(LAB_VENV)/bin/uv pip compile -q --generate-hashes --python-version 3.11 \
			--custom-compile-command "make lock" $$set.txt -o $$set.lock; \
	done
	# SGLang alone: the conformance tests stub what its parser imports but never calls.
	for set in $(basename $(wildcard requirements-sglang-*.txt)); do \
		$(LAB_VENV)/bin/uv pip compile -q --generate-hashes --no-deps --python-version 3.11 \
			--custom-compile-command "make lock" $$set.txt -o $$set.lock; \
	done
	# The gateway's, at the versions the lab's venv runs the tests with.
	for set in litellm router; do \
		$(LAB_VENV)/bin/uv pip compile -q --generate-hashes --python-version 3.11 \
			-c requirements-lab.lock --custom-compile-command "make lock" \
			requirements-$$set.txt -o requirements-$$set.lock; \
	done
