# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sizing filters for vLLM: KV-cache arithmetic as vLLM does it, a memory plan per GPU group, and the command line
for that plan.

Documentation lives in the sidecar files next to this one (vllm_sizing.yml, vllm_kv_cache_bytes.yml,
vllm_max_model_len.yml, vllm_serve_args.yml, vllm_group_member_args.yml, vllm_model.yml, vllm_calibration_key.yml),
so `ansible-doc -t filter NAME` shows it. The implementation is the package plugin_utils/vllm_sizing/ of this
checkout, one concern per module (see its __init__.py): outside filter_plugins/, whose subdirectories Ansible scans
for plugins too. Ansible loads filter plugins under names of its own, so the package is loaded here by its path,
once per process and only when a filter is called, as `vllm_fleet_sizing`; it imports nothing from the rest of the
project.
"""

import importlib.util
import os
import sys

_PACKAGE = "vllm_fleet_sizing"
_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugin_utils", "vllm_sizing")


def _module(name):
    """A module of the package, loaded by path the first time."""
    if _PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(_PACKAGE, os.path.join(_PATH, "__init__.py"),
                                                      submodule_search_locations=[_PATH])
        package = importlib.util.module_from_spec(spec)
        sys.modules[_PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module("%s.%s" % (_PACKAGE, name))


def package():
    """The package with every module loaded (tests and benchmarks reach inside it)."""
    for name in ("kv", "plan", "flags", "shape", "calibration"):
        _module(name)
    return sys.modules[_PACKAGE]


def _lazy(module, name):
    """The package's function, imported at its first call: Ansible loads every filter plugin in each worker process
    that templates a filter (one per host and task), and the package takes about 25 ms to import, which a fleet of
    1,000 hosts would pay on every task that uses any filter."""
    def call(*args, **kwargs):
        return getattr(_module(module), name)(*args, **kwargs)
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
