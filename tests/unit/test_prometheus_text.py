"""The one reader and writer of the Prometheus text format (plugins/module_utils/prometheus_text.py), shared by the
modules and the host agents: label values hold "}", "," and escaped quotes (issue 27: metric_labels cut a value at
"}"); what the agents write is read back by this reader and accepted by Prometheus's own parser (promtool)."""
import os
import subprocess

import pytest
from ansible_collections.vllm_fleet.fleet.plugins.module_utils import prometheus_text, vllm_metrics
from conftest import ROOT, load_file

TOOLS = os.path.join(os.environ.get("VLLM_FLEET_PROMETHEUS_TOOLS")
                     or os.path.join(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"), "prometheus-tools"),
                     "usr", "bin")

TEXT = "\n".join([
    "# HELP vllm_fleet_runtime_oom_total Runtime OOMs.",
    '# TYPE vllm_fleet_runtime_oom_total counter',
    'vllm_fleet_runtime_oom_total{name="vllm@main.service"} 2',
    'vllm_fleet_runtime_oom_total{name="vllm@small.service"} 0',
    'vllm:cache_config_info{block_size="128",note="a}b, \\"q\\" \\\\ end",num_gpu_blocks="40"} 1.0',
    "vllm:num_requests_running 3 1700000000000",
    "vllm:kv_cache_usage_perc NaN",
    'broken{x=1} 2',
    'unclosed{x="1" 2',
    "",
])
# Label values no agent should be able to break the file with: the GPU health agent's "cause" is a kernel line.
NASTY = ['NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3 "x", GPU has fallen off the bus.',
         'a}b, c="d" \\ e', "two\nlines", ""]


def test_samples_read_labels_with_braces_commas_and_escapes():
    found = list(prometheus_text.samples(TEXT))
    assert found == [
        ("vllm_fleet_runtime_oom_total", {"name": "vllm@main.service"}, 2.0),
        ("vllm_fleet_runtime_oom_total", {"name": "vllm@small.service"}, 0.0),
        ("vllm:cache_config_info", {"block_size": "128", "note": 'a}b, "q" \\ end', "num_gpu_blocks": "40"}, 1.0),
        ("vllm:num_requests_running", {}, 3.0),
    ]


def test_metric_labels_and_sums_use_the_same_reader():
    assert vllm_metrics.metric_labels(TEXT, "vllm:cache_config_info")["num_gpu_blocks"] == "40"
    assert vllm_metrics.metric_labels(TEXT, "absent") == {}
    assert vllm_metrics.parse_metrics(TEXT, ("vllm_fleet_runtime_oom_total", "vllm:num_requests_running",
                                             "vllm:kv_cache_usage_perc")) == {
        "vllm_fleet_runtime_oom_total": 2.0, "vllm:num_requests_running": 3.0}


def test_the_writer_escapes_what_the_reader_unescapes():
    rows = [({"cause": value, "n": str(i)}, i + 0.5 if i % 2 else i) for i, value in enumerate(NASTY)]
    text = prometheus_text.render([prometheus_text.family("x_total", "counter", "Help with \\ and\na newline.", rows)])
    assert text.splitlines()[:2] == ["# HELP x_total Help with \\\\ and\\na newline.", "# TYPE x_total counter"]
    assert len(text.splitlines()) == 2 + len(NASTY)  # a newline in a value does not end its line
    assert list(prometheus_text.samples(text)) == [("x_total", labels, float(value)) for labels, value in rows]


def test_the_writer_refuses_a_name_or_type_the_format_has_not():
    with pytest.raises(ValueError):
        prometheus_text.family("not a name", "gauge", "h", [])
    with pytest.raises(ValueError):
        prometheus_text.family("x", "meter", "h", [])


def agents_textfiles(tmp_path):
    """What each host agent writes, through its own renderer and the shared writer, with label values it could meet."""
    watchdog = load_file(os.path.join(ROOT, "roles", "vllm", "files", "vllm-watchdog"), "vllm_watchdog_text")
    counter = load_file(os.path.join(ROOT, "roles", "vllm", "files", "vllm-oom-counter"), "vllm_oom_counter_text")
    health = load_file(os.path.join(ROOT, "roles", "nvidia_gpu", "files", "nvidia-gpu-health"), "gpu_health_text")
    state = {"main": {"verdict": "down", "since": 1765000000.5, "valve": {"maxconn": 4, "plan": 8}},
             "small": {"verdict": "up", "since": None, "valve": None}}
    agent = health.Health({"kmsg": str(tmp_path / "kmsg"), "textfile": str(tmp_path / "gpu.prom")})
    agent.dcgm = "Warning"
    agent.metrics({"seq": 42, "counts": {"0000:3b:00.0|xid-79|reboot": 3},
                   "quarantine": {"0000:3b:00.0": {"pci_bus_id": "00000000:3B:00.0", "class": "reboot",
                                                   "fault": "xid-79", "cause": NASTY[0]}}})
    return {"vllm-watchdog": watchdog.render_textfile(state),
            "vllm-oom-counter": counter.render_textfile({"vllm@main.service": 2, "vllm@b.service": 0}),
            "nvidia-gpu-health": (tmp_path / "gpu.prom").read_text()}


@pytest.mark.parametrize("agent", ["vllm-watchdog", "vllm-oom-counter", "nvidia-gpu-health"])
def test_each_agents_textfile_is_read_by_prometheus_and_by_the_reader(agent, tmp_path):
    text = agents_textfiles(tmp_path)[agent]
    promtool = os.path.join(TOOLS, "promtool")
    if not os.access(promtool, os.X_OK):
        pytest.fail(f"{promtool} is missing: run `make prometheus-tools` (Debian's packages, unpacked)")
    run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert run.returncode == 0, (text, run.stdout, run.stderr)
    assert len(list(prometheus_text.samples(text))) == sum(1 for line in text.splitlines() if line[:1] != "#")
