"""Calibration: a start's vllm_startup_report (or a calibration store entry) in policy.measured replaces the budget's
estimates, on the published GPU startups and on the CPU build's own output."""
import os
import sys

import pytest
from ansible.errors import AnsibleFilterError
from conftest import ROOT, gpu

import vllm_sizing as vs
import vllm_fleet_sizing as sz  # the package vllm_sizing loads
import vllm_startup_report

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_calibration  # noqa: E402

ROWS = bench_calibration.calibrated()
A10G = [gpu("NVIDIA A10G", 23028, "8.6")]
QWEN3 = vs.vllm_model("Qwen/Qwen3-8B")


def cpu_report(name):
    with open(os.path.join(ROOT, "tests", "fixtures", "vllm-logs", name), encoding="utf-8") as handle:
        return vllm_startup_report.vllm_startup_report(handle.read())


@pytest.mark.parametrize("ident, estimate, calibrated, parts", ROWS, ids=[row[0] for row in ROWS])
def test_a_measured_start_makes_the_next_plan_exact(ident, estimate, calibrated, parts):
    """Never above what vLLM had by more than 0.5 %; within 2 % once the profiling line (activation, non-torch) was
    printed (pipeline stages: the busiest one is budgeted), where the estimate alone is off by up to 5 %."""
    assert calibrated <= 0.5
    if "activation_peak_bytes" in parts and "non_torch_bytes" in parts:
        assert abs(calibrated) <= 2.0 and abs(calibrated) <= abs(estimate) + 0.05


def test_cpu_build_kv_space_is_taken_as_measured():
    plan = vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096}, {"measured": cpu_report("cpu032-startup-eager.log")})
    assert plan["budget_per_gpu"]["kv_cache_bytes"] == 1 << 30
    assert plan["calibration"]["parts"] == ["kv_cache_bytes"] and plan["calibration"]["compile_cache"] == "none"
    assert plan["calibration"]["error_percent"] > 100  # the stand-in A10G's prediction is far from the CPU's 1 GiB
    assert plan["calibration"]["flagged"] is True
    assert any(line.startswith("measured: kv_cache_bytes used instead of estimates") for line in plan["applied"])


def test_a_cold_compile_cache_never_raises_the_kv_cache_above_the_estimate():
    report = dict(cpu_report("cpu032-startup-compiled.log"), available_kv_cache_bytes=40 << 30)
    assert report["compiled_from_cache"] is False
    plan = vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096}, {"measured": report})
    assert plan["calibration"]["compile_cache"] == "cold"
    assert plan["budget_per_gpu"]["kv_cache_bytes"] == plan["calibration"]["predicted_kv_cache_bytes"]
    assert any("cold torch.compile cache" in line for line in plan["applied"])
    warm = vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096}, {"measured": dict(report, compiled_from_cache=True)})
    assert warm["budget_per_gpu"]["kv_cache_bytes"] == 40 << 30


def test_a_store_entry_applies_to_its_own_configuration_only():
    plan = vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096}, {"model": "Qwen/Qwen3-8B"})
    key = sz.calibration.key_fields(plan)
    entry = {"key": sz.calibration.key_path(key), "host": "gpu-1", "instance": "main",
             "started_at": "Fri 2026-12-04 15:37:28 UTC",
             "report": {"available_kv_cache_bytes": 1 << 30, "kv_cache_device": "CPU"}}
    measured = vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096}, {"model": "Qwen/Qwen3-8B", "measured": entry})
    assert measured["calibration"]["source"]["host"] == "gpu-1"
    assert "measured on gpu-1 instance main started Fri 2026-12-04" in " ".join(measured["applied"])
    doubled = dict(key, max_num_batched_tokens=key["max_num_batched_tokens"] * 2)
    other = dict(entry, key=sz.calibration.key_path(doubled))
    assert "calibration" not in vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096},
                                               {"model": "Qwen/Qwen3-8B", "measured": other})


def test_calibration_key_names_the_configuration():
    plan = vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096}, {"model": "/srv/models/Qwen3-8B/"})
    assert sz.calibration.calibration_key(plan) == (
        "nvidia-a10g/qwen3-8b/vllm-0.34.0/tp1-pp1-auto-none-kv-auto-b%d-graphs"
        % plan["engine_args"]["max_num_batched_tokens"])
    assert vs.FilterModule().filters()["vllm_calibration_key"] is sz.calibration.calibration_key
    with pytest.raises(AnsibleFilterError, match=r"vllm_calibration_key takes a plan from vllm_sizing"):
        sz.calibration.calibration_key({"fits": True})


@pytest.mark.parametrize("measured, message", [
    ("report", r"policy.measured must be a dict, got str"),
    ({"kv_cache_tokens": 5}, r"policy.measured holds none of model_loading_bytes"),
    ({"available_kv_cache_bytes": "1 GiB"}, r"policy.measured: available_kv_cache_bytes must be a number of bytes"),
    ({"report": [1]}, r"policy.measured.report must be a dict, got list"),
    ({"key": {"tp": 1}, "report": {"available_kv_cache_bytes": 1}}, r"policy.measured.key must be the store directory"),
])
def test_malformed_measurements(measured, message):
    with pytest.raises(AnsibleFilterError, match=message):
        vs.vllm_sizing(A10G, QWEN3, {"p99_context": 4096}, {"measured": measured})
