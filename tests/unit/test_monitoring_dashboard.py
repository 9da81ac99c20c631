"""The monitoring role's dashboard and rules read only metrics that exist: the names vLLM 0.32/0.34, HAProxy 2.6's
exporter and node exporter 1.5 export (checked by hand against their sources, listed here with where each comes
from), and the dashboard's queries are templated on its Prometheus datasource."""
import json
import os
import re

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROLE = os.path.join(ROOT, "roles", "monitoring")

EXPORTED = {
    # vllm/v1/metrics/loggers.py (0.32.0 and 0.34.0); prometheus_client adds _total to counters.
    "vllm:num_requests_running": "vLLM gauge",
    "vllm:num_requests_waiting": "vLLM gauge",
    "vllm:kv_cache_usage_perc": "vLLM gauge",
    "vllm:num_preemptions_total": "vLLM counter vllm:num_preemptions",
    "vllm:generation_tokens_total": "vLLM counter vllm:generation_tokens",
    "vllm:prompt_tokens_total": "vLLM counter vllm:prompt_tokens",
    # node exporter 1.5 systemd collector (--collector.systemd, --collector.systemd.enable-restarts-metrics).
    "node_systemd_unit_state": "node exporter",
    "node_systemd_service_restart_total": "node exporter",
    # The vllm role's files/vllm-oom-counter, through node exporter's textfile collector.
    "vllm_fleet_runtime_oom_total": "vllm-oom-counter",
    # The vllm role's files/vllm-watchdog, through node exporter's textfile collector.
    "vllm_fleet_watchdog_wedged": "vllm-watchdog",
    "vllm_fleet_valve_maxconn": "vllm-watchdog",
    "vllm_fleet_valve_plan_maxconn": "vllm-watchdog",
    # The nvidia_gpu role's files/nvidia-gpu-health, through node exporter's textfile collector.
    "nvidia_gpu_quarantined": "nvidia-gpu-health",
    # HAProxy 2.6 `http-request use-service prometheus-exporter`.
    "haproxy_server_status": "HAProxy",
    # Prometheus itself, per target.
    "up": "Prometheus",
}

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "on", "without", "ignoring", "group_left", "group_right"}


def metrics(expr):
    """Metric names of a PromQL expression: what is left after strings, label matchers, ranges, grouping clauses
    and function calls are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", expr)
    return {n for n in names if n not in KEYWORDS and not re.fullmatch(r"\d.*", n)}


def rules():
    data = yaml.safe_load(open(os.path.join(ROLE, "vars", "main.yml")))
    return [rule for group in data["monitoring_rule_groups"] for rule in group["rules"]]


def test_every_alert_has_a_summary_naming_a_playbook_and_no_annotation_is_left_over():
    annotations = yaml.safe_load(open(os.path.join(ROLE, "files", "alert-annotations.yml")))
    assert sorted(annotations) == sorted(rule["alert"] for rule in rules())
    for alert, text in annotations.items():
        assert set(text) == {"summary", "description"}, alert
        assert re.search(r"playbooks/\w+\.yml", text["summary"]), alert


def dashboard():
    return json.load(open(os.path.join(ROLE, "files", "vllm-fleet.json")))


def test_metrics_helper_finds_names_not_labels_or_functions():
    assert metrics('sum by (host, instance) (rate(vllm:num_preemptions_total{host=~"$host"}[$__rate_interval]))'
                   ' > 0 and on (host) up == 0') == {"vllm:num_preemptions_total", "up"}


def test_rules_read_only_exported_metrics():
    used = set()
    for rule in rules():
        found = metrics(re.sub(r"\{\{.*?\}\}", "1", rule["expr"]))
        assert found, rule["alert"]
        used |= found
    assert used <= set(EXPORTED), used - set(EXPORTED)


def test_every_panel_queries_exported_metrics_through_the_datasource_variable():
    dash = dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert dash["panels"]
    used = set()
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            found = metrics(target["expr"])
            assert found and found <= set(EXPORTED), (panel["title"], found)
            used |= found
    # KV usage, running/waiting, preemptions, tokens/s, restarts, unit state, balancer state, wedges: all shown.
    assert used == set(EXPORTED) - {"up"}
    # The host and instance pickers list the labels the role's scrape configuration puts on every vLLM target.
    for name in ("host", "instance"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        metric, label = re.fullmatch(r"label_values\(([\w:]+)(?:\{[^}]*\})?, (\w+)\)",
                                     variables[name]["definition"]).groups()
        assert metric in EXPORTED and label == name


def test_panel_ids_and_positions_are_unique():
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert len({(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}) == len(panels)
