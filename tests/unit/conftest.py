"""Unit-test helpers: load a host program by its path, shared GPU facts. (The collection's Python and the filter
files are on the path from pytest.ini.)"""
import importlib.machinery
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_file(path, name):
    """The Python file at path (a host program, which has no .py) as a fresh module called name."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


def gpu(name, total_mib, capability, used_mib=0):
    """One GPU as the nvidia_gpu_facts module reports it (docs/interfaces.md)."""
    return {"index": 0, "name": name, "uuid": "GPU-0", "memory_total_mib": total_mib, "memory_used_mib": used_mib,
            "driver_version": "550.144.03", "compute_capability": capability, "mig_mode": None}


@pytest.fixture
def a10g():
    return [gpu("NVIDIA A10G", 23028, "8.6")]


@pytest.fixture
def h100x8():
    return [dict(gpu("NVIDIA H100 80GB HBM3", 81559, "9.0"), index=i) for i in range(8)]


# The corpus test's figures, printed after the run (issue 10 "Done when"): the summary line of
# benchmarks/bench_budget.py, from its own code, over the rows the test module sized (not sized again here), when
# test_predicted_kv_within_bounds ran.
CORPUS_TEST = "test_vllm_sizing_corpus.py::test_predicted_kv_within_bounds"


def pytest_terminal_summary(terminalreporter):
    ran = any(CORPUS_TEST in getattr(report, "nodeid", "") and getattr(report, "when", None) == "call"
              for reports in terminalreporter.stats.values() for report in reports)
    if not ran:
        return
    corpus = sys.modules["test_vllm_sizing_corpus"]
    terminalreporter.write_sep("-", "vLLM sizing corpus (benchmarks/bench_budget.py)")
    terminalreporter.write_line(corpus.bench_budget.summary(corpus.ROWS))
    terminalreporter.write_line("%d logs not sized (reasons: pytest -rs, or the benchmark)" % len(corpus.SKIPPED))
