"""The vLLM metric names the monitoring role's rules and dashboard read (tests/unit/test_monitoring_dashboard.py's
EXPORTED table) exist in the real vLLM CPU build of the controller's venv, with the kind their names imply: a
prometheus_client Counter is exported with _total, a Gauge as it is named."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit"))
from test_monitoring_dashboard import EXPORTED  # noqa: E402

pytestmark = pytest.mark.oracle

PYTHON = os.path.join(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"), "vllm-venv", "bin", "python")
if not os.path.exists(PYTHON):
    pytest.skip("no controller vLLM venv at %s (make controller-vllm builds it)" % PYTHON, allow_module_level=True)


def test_vllm_exports_the_metrics_the_rules_read():
    # The source, not an import: importing vllm.v1.metrics.loggers pulls in torch for nothing.
    spec = subprocess.run([PYTHON, "-c", "import importlib.util as u; "
                           "print(u.find_spec('vllm').submodule_search_locations[0])"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    source = open(os.path.join(spec, "v1", "metrics", "loggers.py")).read()
    declared = dict((name, kind) for kind, name in
                    re.findall(r"self\._(counter|gauge|histogram)_cls\(\s*name=\"(vllm:\w+)\"", source))
    for name in (n for n in EXPORTED if n.startswith("vllm:")):
        if name.endswith("_total"):
            assert declared.get(name[:-len("_total")]) == "counter", name
        else:
            assert declared.get(name) == "gauge", name
