"""One schema per input (issue 27 item 3): the sizing's own schema of its workload and policy
(plugins/plugin_utils/vllm_sizing/inputs.py, what the filter checks at the door) is the one the filter's documentation
(filter_plugins/vllm_sizing.yml) and the vllm role's argument specs (vllm_workload, vllm_policy) describe: same keys,
same types, same choices, so a key one of them accepts and another refuses cannot creep in."""
import os

import pytest
import yaml
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing import inputs
from ansible_collections.vllm_fleet.fleet.plugins.plugin_utils.vllm_sizing.kv import KV_DTYPE_BYTES
from conftest import ROOT

# Policy keys the role sets from its own variables (vllm_model..., vllm_version, vllm_serve_options,
# vllm_plan_strict) or from the calibration store, never from vllm_policy; and nodes, a replica group's size, which
# the role does not deploy yet (issue 29: docs/multi-node.md).
ROLE_SET = {"host", "model", "vllm_version", "serve_options", "strict", "measured", "loadtest", "nodes"}
# The sizing's kinds as Ansible types.
TYPES = {"int": "int", "bytes": "int", "bool": "bool", "str": "str", "dict": "dict", "fraction": "float",
         "entries": "raw"}


def load(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def role_options(name):
    return load("roles", "vllm", "meta", "argument_specs.yml")["argument_specs"]["plan"]["options"][name]["options"]


def filter_options(name):
    return load("filter_plugins", "vllm_sizing.yml")["DOCUMENTATION"]["options"][name]["suboptions"]


def ansible_type(kind):
    return "str" if isinstance(kind, tuple) else TYPES[kind]


@pytest.mark.parametrize("schema, role, doc", [(inputs.WORKLOAD, "vllm_workload", "workload"),
                                               (inputs.POLICY, "vllm_policy", "policy")])
def test_the_role_and_the_documentation_describe_the_sizings_schema(schema, role, doc):
    documented, specified = filter_options(doc), role_options(role)
    assert set(documented) == set(schema), "filter_plugins/vllm_sizing.yml %s: keys differ from inputs.py" % doc
    assert set(specified) == set(schema) - ROLE_SET, "roles/vllm argument_specs %s: keys differ from inputs.py" % role
    for key, (kind, default, _text) in schema.items():
        for where, options in (("filter documentation", documented), ("argument specs", specified)):
            if key in options:
                assert options[key].get("type", "str") == ansible_type(kind), "%s: %s.%s" % (where, doc, key)
                if isinstance(kind, tuple):
                    assert set(options[key].get("choices", [])) == set(kind), "%s: %s.%s choices" % (where, doc, key)
        # Where the schema fills in a value, the documentation says that one (where it leaves None, the documentation
        # may name what None resolves to: the newest release, the model's maximum).
        if default is not None:
            assert documented[key].get("default") == default, "filter documentation: %s.%s default" % (doc, key)


def test_the_roles_kv_cache_dtypes_are_the_ones_the_sizing_sizes():
    """Which of them a release takes is the release table's (checked_kv_dtype): the role refuses none it sizes."""
    assert set(role_options("vllm_policy")["kv_cache_dtype"]["choices"]) == set(KV_DTYPE_BYTES)


def test_the_door_returns_frozen_values_with_every_key_filled_in():
    import dataclasses
    policy = inputs.policy({"gpu_sharing": "shared"})
    assert [f.name for f in dataclasses.fields(policy)] == list(inputs.POLICY)
    assert policy.gpu_sharing == "shared" and policy.strict is True and policy.measured is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.gpu_sharing = "dedicated"
    assert inputs.workload({"p99_context": 4096}).peak_concurrency is None
