# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sizing filters for vLLM: KV-cache arithmetic as vLLM does it, a memory plan per GPU group, and the command line
for that plan.

Documentation lives in the sidecar files next to this one (vllm_sizing.yml, vllm_kv_cache_bytes.yml,
vllm_max_model_len.yml, vllm_serve_args.yml, vllm_group_member_args.yml, vllm_model.yml, vllm_calibration_key.yml),
so `ansible-doc -t filter NAME` shows it. The implementation is the collection's package
plugins/plugin_utils/vllm_sizing/, one concern per module (see its __init__.py); it imports nothing from the rest of
the project.
"""

import importlib

PACKAGE = "ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing"


def package():
    """The package with every module loaded (tests and benchmarks reach inside it)."""
    for name in ("kv", "plan", "flags", "shape", "calibration"):
        importlib.import_module("%s.%s" % (PACKAGE, name))
    return importlib.import_module(PACKAGE)


def _lazy(module, name):
    """The package's function, imported at its first call: Ansible loads every filter plugin in each worker process
    that templates a filter (one per host and task), and the package takes about 25 ms to import, which a fleet of
    1,000 hosts would pay on every task that uses any filter."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module("%s.%s" % (PACKAGE, module)), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


vllm_kv_cache_bytes = _lazy("kv", "vllm_kv_cache_bytes")
vllm_max_model_len = _lazy("kv", "vllm_max_model_len")
vllm_sizing = _lazy("plan", "vllm_sizing")
vllm_serve_args = _lazy("flags", "vllm_serve_args")
vllm_group_member_args = _lazy("flags", "group_member_args")
vllm_model = _lazy("shape", "vllm_model")
vllm_calibration_key = _lazy("calibration", "calibration_key")


class FilterModule(object):
    """vLLM sizing filters."""

    def filters(self):
        return {
            "vllm_kv_cache_bytes": vllm_kv_cache_bytes,
            "vllm_max_model_len": vllm_max_model_len,
            "vllm_sizing": vllm_sizing,
            "vllm_serve_args": vllm_serve_args,
            "vllm_group_member_args": vllm_group_member_args,
            "vllm_model": vllm_model,
            "vllm_calibration_key": vllm_calibration_key,
        }
