# Two entry points: `make demo` (the main job on a local test fleet) and `make test` (every test).
# `make check` is the fast inner loop: lint, ansible-test sanity, unit tests. Each target installs what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
BIN := $(VENV)/bin
export VLLM_FLEET_CACHE ?= /var/cache/vllm-fleet
export VLLM_FLEET_PROMETHEUS_TOOLS ?= $(VLLM_FLEET_CACHE)/prometheus-tools
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
PLAYBOOKS := $(wildcard playbooks/*.yml)
# Two lanes, then the fleet alone. The scenarios that mostly wait on apt, dpkg and systemd run beside the oracle
# (CPU-bound, two vLLM processes); the balancer's, which times traffic through HAProxy to stand-ins, follows the
# oracle in its lane, beside them (its drain tests hold sessions long enough for a playbook starting on two busy
# cores). The fleet times real vLLM under load: alone.
BESIDE_ORACLE := schedule driver
AFTER_ORACLE := balancer
ALONE := fleet
SCENARIOS := $(BESIDE_ORACLE) $(AFTER_ORACLE) $(ALONE)

.PHONY: help venv host image wheelhouse controller-vllm oracle-vllm vllm-source models controller-check fleet-deps prometheus-tools lint unit sanity check oracle molecule \
	scenarios-beside-oracle oracle-lane scenarios-alone \
	test demo bench probe-multinode clean readmes

help:
	@echo "make demo   deploy to a local test fleet and show the result"
	@echo "make test   every test: lint, unit, oracle (real vLLM), Molecule scenarios ($(SCENARIOS))"
	@echo "make check  fast loop: lint, ansible-test sanity, unit tests"
	@echo "make bench  benchmarks (figures, not pass/fail)"
	@echo "make probe-multinode  does vLLM's CPU build run one instance across two hosts (docs/multi-node.md)"

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@
venv: $(VENV)/.installed

host:
	bash scripts/setup-host.sh
image: host
	bash scripts/build-image.sh
# After the venv: the scripts' python3 is the venv's (PATH above), which `make -j2 check fleet-deps` creates meanwhile.
wheelhouse: venv
	bash scripts/build-wheelhouse.sh
controller-vllm: wheelhouse
	bash scripts/build-controller-vllm.sh
# The oracle's second release of the CPU build (scripts/lib.sh VLLM_ORACLE_VERSION).
oracle-vllm: venv
	bash scripts/build-oracle-vllm.sh
MAKE_MODEL := $(VLLM_FLEET_CACHE)/vllm-venv/bin/python scripts/make_test_model.py
models: controller-vllm
	$(MAKE_MODEL) $(VLLM_FLEET_CACHE)/models/tiny-llama
	# 32 KiB of KV per token and a 64k context: fits a GPU's plan, not the CPU build's 1 GiB KV (fault tests).
	$(MAKE_MODEL) $(VLLM_FLEET_CACHE)/models/tiny-llama-long --set num_hidden_layers=8 --set num_attention_heads=8 \
	  --set num_key_value_heads=8 --set head_dim=128 --set hidden_size=256 --set max_position_embeddings=65536
	# A LoRA adapter for tiny-llama (runtime LoRA tests).
	$(VLLM_FLEET_CACHE)/vllm-venv/bin/python scripts/make_test_lora.py $(VLLM_FLEET_CACHE)/models/tiny-llama \
	  $(VLLM_FLEET_CACHE)/models/tiny-llama-lora
# Once per make run, before any scenario: the controller's vLLM must serve a completion on this CPU, or nothing can.
controller-check: models
	$(VLLM_FLEET_CACHE)/vllm-venv/bin/python scripts/check_controller_vllm.py $(VLLM_FLEET_CACHE)/models/tiny-llama
fleet-deps: image wheelhouse models controller-check
# The Python source of every vLLM release since 0.11.0 (PyPI), so the release table's test reads each row's release.
vllm-source: venv
	$(BIN)/python tools/vllm_release.py fetch --all
# promtool and amtool (Debian's packages, unpacked into the cache) for the monitoring role's rule tests.
prometheus-tools:
	bash scripts/get-prometheus-tools.sh

# Every playbook's syntax in one ansible-playbook run (each run starts in seconds).
lint: venv
	$(BIN)/yamllint --strict .
	$(BIN)/ruff check .
	$(BIN)/ansible-lint --profile production --strict
	$(BIN)/ansible-playbook --syntax-check -i inventory.example $(PLAYBOOKS)
unit: venv prometheus-tools vllm-source
	$(BIN)/pytest tests/unit tests/playbooks -q
check: lint unit sanity

# ansible-test sanity on the collection as it ships (ansible-galaxy collection build: galaxy.yml's build_ignore leaves
# out the tests, benchmarks and Molecule), unpacked under ansible_collections/ outside this git checkout (inside it
# ansible-test lists the files git tracks there: none). Each test's requirements go into a virtual environment of
# ansible-test's, bootstrapped with pip's wheel from PyPI (scripts/ansible-test-get-pip.py: ansible-test's own
# bootstrap script is not reachable from the build hosts).
ANSIBLE_TEST_PIP := 24.2
ANSIBLE_TEST_CACHE := $(HOME)/.ansible/test/cache
sanity: venv
	rm -rf .build/collection && mkdir -p .build/collection $(ANSIBLE_TEST_CACHE)
	$(BIN)/ansible-galaxy collection build --output-path .build/collection >/dev/null
	test -f $(ANSIBLE_TEST_CACHE)/pip-$(ANSIBLE_TEST_PIP)-py3-none-any.whl || \
	  $(BIN)/pip download -q --no-deps -d $(ANSIBLE_TEST_CACHE) pip==$(ANSIBLE_TEST_PIP)
	cp scripts/ansible-test-get-pip.py $(ANSIBLE_TEST_CACHE)/get_pip_$(subst .,_,$(ANSIBLE_TEST_PIP)).py
	root=$$(mktemp -d) && trap 'rm -rf "$$root"' EXIT && dir=$$root/ansible_collections/vllm_fleet/fleet && \
	  mkdir -p $$dir && tar -xzf .build/collection/vllm_fleet-fleet-*.tar.gz -C $$dir && cd $$dir && \
	  $(CURDIR)/$(BIN)/ansible-test sanity --venv --python 3.11 --color no \
	    --test validate-modules --test pylint --test pep8

oracle: venv controller-check oracle-vllm
	$(BIN)/pytest tests/oracle -q -m oracle
# A failed scenario's destroy ends its output: the names of its failed tests are printed after it.
SCENARIO_TEST = rm -f reports/junit/$$s.xml; $(BIN)/molecule test -s $$s || { $(BIN)/python scripts/test_failures.py reports/junit/$$s.xml; exit 1; }
molecule: venv fleet-deps
	for s in $(SCENARIOS); do $(SCENARIO_TEST); done
scenarios-beside-oracle: venv fleet-deps
	for s in $(BESIDE_ORACLE); do $(SCENARIO_TEST); done
# The oracle, then the scenarios after it in its lane (fleet-deps: built by the step before in make test).
oracle-lane: oracle
	for s in $(AFTER_ORACLE); do $(SCENARIO_TEST); done
# Run by test after the two lanes, whose prerequisites (fleet-deps) it shares: not built twice.
scenarios-alone:
	for s in $(ALONE); do $(SCENARIO_TEST); done

# On a fresh machine, what the scenarios need (image, wheelhouse, vLLM venvs, models: downloads and disk) is built
# beside lint and unit tests (CPU); the host's packages first and alone, as two apt-get runs cannot share apt's lock.
# Then the two lanes (each one's output whole when it ends), then the fleet.
test:
	$(MAKE) --no-print-directory host
	$(MAKE) --no-print-directory -j2 --output-sync=target check fleet-deps oracle-vllm
	$(MAKE) --no-print-directory -j2 --output-sync=target oracle-lane scenarios-beside-oracle
	$(MAKE) --no-print-directory scenarios-alone

demo: venv fleet-deps
	bash scripts/demo.sh

bench: venv models
	$(BIN)/python benchmarks/bench_sizing.py
	$(BIN)/python benchmarks/bench_budget.py
	$(BIN)/python benchmarks/bench_calibration.py
	$(BIN)/python benchmarks/bench_controller.py --roll
	$(VLLM_FLEET_CACHE)/vllm-venv/bin/python benchmarks/bench_warm_start.py $(VLLM_FLEET_CACHE)/models/tiny-llama

# Issue 29's first question, asked of real vLLM (about 5 minutes; not part of make test).
probe-multinode: image models
	bash scripts/probe_multinode.sh

clean:
	for s in $(SCENARIOS); do $(BIN)/molecule destroy -s $$s || true; done

# Each role's README.md: its generated part (entry points, variables) from defaults and argument specs.
readmes: venv
	$(BIN)/python tools/role_readme.py
