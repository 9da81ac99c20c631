#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load or unload a LoRA adapter on a running vLLM instance (runtime LoRA updating)."""
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_lora
short_description: Load or unload a LoRA adapter on a running vLLM instance
description:
  - Reads C(GET /v1/models) on 127.0.0.1 and calls C(POST /v1/load_lora_adapter) or C(POST /v1/unload_lora_adapter)
    only when the adapter is not already in the wanted state (idempotent; supports check mode).
  - The instance must run with C(--enable-lora) and C(VLLM_ALLOW_RUNTIME_LORA_UPDATING=true) (vllm_runtime_lora).
  - Adapters loaded at runtime are gone after a restart; the vllm role loads vllm_lora_adapters again after each
    start.
options:
  port: {description: HTTP port of the instance, type: int, required: true}
  api_key: {description: API key (VLLM_API_KEY), type: str, default: ""}
  name: {description: the adapter's name (the model name clients ask for), type: str, required: true}
  path: {description: the adapter's directory on the host (PEFT layout), type: path}
  state: {description: present (loaded) or absent, type: str, default: present, choices: [present, absent]}
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Load the SQL adapter
  vllm_fleet.fleet.vllm_lora:
    port: 8000
    api_key: "{{ vllm_api_key }}"
    name: sql
    path: /srv/lora/sql
"""

RETURN = r"""
loaded: {description: "adapters loaded on the instance afterwards, name to path", type: dict, returned: success}
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_http import http


def loaded_adapters(module, base, api_key):
    status, body = http(base + "/v1/models", api_key=api_key)
    if status != 200:
        module.fail_json(msg="GET /v1/models on %s answered %s: %s" % (base, status, body[:500]))
    return {m["id"]: m.get("root") for m in json.loads(body).get("data", []) if m.get("parent")}


def call(module, base, api_key, endpoint, payload):
    status, body = http(base + endpoint, payload, api_key=api_key, timeout=120)
    if status == 404 and "Not Found" in body:
        module.fail_json(msg="%s has no %s: runtime LoRA updating is off on this instance. Set vllm_runtime_lora: "
                             "true and roll the host (playbooks/rolling_restart.yml -e rolling_restart_apply_config=true)"
                             % (base, endpoint))
    if status != 200:
        module.fail_json(msg="POST %s %s on %s answered %s: %s" % (endpoint, payload, base, status, body[:1000]))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            port=dict(type="int", required=True),
            api_key=dict(type="str", default="", no_log=True),
            name=dict(type="str", required=True),
            path=dict(type="path"),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        required_if=[("state", "present", ["path"])],
        supports_check_mode=True,
    )
    p = module.params
    base = "http://127.0.0.1:%d" % p["port"]
    if p["state"] == "present" and not os.path.isfile(os.path.join(p["path"], "adapter_config.json")):
        module.fail_json(msg="LoRA adapter %s: %s has no adapter_config.json on this host (copy the adapter there "
                             "first; it must be readable by the vllm user)" % (p["name"], p["path"]))
    loaded = loaded_adapters(module, base, p["api_key"])
    current = loaded.get(p["name"])
    if p["state"] == "present" and current == p["path"]:
        module.exit_json(changed=False, loaded=loaded)
    if p["state"] == "absent" and p["name"] not in loaded:
        module.exit_json(changed=False, loaded=loaded)
    if not module.check_mode:
        if p["name"] in loaded:  # absent, or present from another path: unload first
            call(module, base, p["api_key"], "/v1/unload_lora_adapter", {"lora_name": p["name"]})
        if p["state"] == "present":
            call(module, base, p["api_key"], "/v1/load_lora_adapter", {"lora_name": p["name"], "lora_path": p["path"]})
        loaded = loaded_adapters(module, base, p["api_key"])
    module.exit_json(changed=True, loaded=loaded)


if __name__ == "__main__":
    main()
