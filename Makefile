# twinbolt: `make demo` runs the whole experiment on the embedded lab;
# `make test` runs every test. Both set the machine up first if needed.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := openssh-server openssh-client runit kmod iptables iproute2 iputils-ping \
	binutils gcc procps util-linux
STAMP := $(VENV)/.installed

.PHONY: setup lab lab-down demo test soak lint lock

setup: $(STAMP)

$(STAMP): requirements.lock
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "setup: installing Debian packages: $$missing"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	touch $(STAMP)

lab: setup
	$(PY) -m lab up
	$(PY) -m lab status

lab-down:
	$(PY) -m lab down

# tp2_e2e reached, proven and measured; then production restored and proven,
# whether or not a step before it failed.
demo: lab
	@failed=0; \
	$(VENV)/bin/pyinfra -y inventory.py deploy.py --data state=tp2_e2e \
		&& $(PY) -m pytest tests/verify --state tp2_e2e -q -p no:cacheprovider \
		&& $(PY) experiment.py measure --state tp2_e2e \
		|| failed=1; \
	$(VENV)/bin/pyinfra -y inventory.py deploy.py --data state=production \
		&& $(PY) -m pytest tests/verify --state production -q -p no:cacheprovider \
		&& exit $$failed

lint: setup
	$(VENV)/bin/ruff check .

# Every test, then a short interruption sweep (`make soak SOAK_POINTS=N` for a longer one).
test: setup lint
	$(PY) -m lab up
	$(PY) -m pytest tests/unit tests/lab tests/e2e
	$(MAKE) soak

# Kill runs of production -> tp2_e2e -> production at SOAK_POINTS points per leg;
# every next run must converge and verify.
SOAK_POINTS ?= 2
soak: lab
	$(PY) tests/soak/interrupt.py --points $(SOAK_POINTS)

lock:
	$(PY) -m pip freeze --exclude-editable > requirements.lock
