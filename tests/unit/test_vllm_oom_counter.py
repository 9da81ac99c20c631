"""files/vllm-oom-counter: runtime OOMs (failure 2) counted from real vLLM log lines for node exporter's textfile
collector; startup OOMs and prompts that quote OOM text are not counted."""
import importlib.machinery
import importlib.util
import os
import sys

import pytest
from conftest import ROOT

ROLE = os.path.join(ROOT, "roles", "vllm")
LOGS = os.path.join(ROOT, "tests", "fixtures", "vllm-logs")
# On a host the script imports vllm_diagnosis from its own directory; here from the role's module_utils.
sys.path.insert(0, os.path.join(ROLE, "module_utils"))
_loader = importlib.machinery.SourceFileLoader("vllm_oom_counter", os.path.join(ROLE, "files", "vllm-oom-counter"))
counter = importlib.util.module_from_spec(importlib.util.spec_from_loader("vllm_oom_counter", _loader))
_loader.exec_module(counter)


def log(name):
    with open(os.path.join(LOGS, name), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("name, expected", [
    ("torch-oom-512-bytes.log", 1), ("torch-oom-kib.log", 1), ("kaito-976-fragmentation-v0.log", 1),
    ("club-3090-16-hint-not-fragmentation.log", 1),
    # Failure 1 and 3 without an OOM, and a prompt quoting OOM text: nothing to count.
    ("vllm-14092-load-model-oom.log", 0), ("cpu032-kv-startup.log", 0), ("cpu032-engine-dead.log", 0),
    ("prompts-with-failure-text.log", 0), ("cpu032-startup-eager.log", 0),
])
def test_counts_runtime_ooms_only(name, expected):
    assert counter.runtime_ooms(log(name)) == expected


def test_two_ooms_in_one_stretch_count_twice():
    text = log("torch-oom-512-bytes.log")
    assert counter.runtime_ooms(text + "\n" + log("serving-start.log") + "\n" + text) == 2


def test_textfile_format_is_what_node_exporter_reads():
    assert counter.render({"vllm@b.service": 2, "vllm@a.service": 0}) == (
        "# HELP vllm_fleet_runtime_oom_total Runtime out-of-memory failures vLLM logged, counted from the journal.\n"
        "# TYPE vllm_fleet_runtime_oom_total counter\n"
        'vllm_fleet_runtime_oom_total{name="vllm@a.service"} 0\n'
        'vllm_fleet_runtime_oom_total{name="vllm@b.service"} 2\n')
