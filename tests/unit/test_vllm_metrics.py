"""The one reader of the Prometheus text format (plugins/module_utils/vllm_metrics.py), shared by the modules and
the host agents: label values hold "}", "," and escaped quotes (issue 27: metric_labels cut a value at "}")."""
from ansible_collections.vllm_fleet.fleet.plugins.module_utils import vllm_metrics

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


def test_samples_read_labels_with_braces_commas_and_escapes():
    found = list(vllm_metrics.samples(TEXT))
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
