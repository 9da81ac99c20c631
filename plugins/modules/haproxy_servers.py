#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read and set the admin state of HAProxy servers through the admin socket, and wait for a condition."""
from __future__ import annotations

DOCUMENTATION = r"""
module: haproxy_servers
short_description: Query, drain, disable or enable HAProxy servers through the admin socket, and wait
description:
  - Talks to HAProxy's UNIX admin socket (C(stats socket ... level admin)); run it on the balancer
    (C(delegate_to)).
  - Replaces C(community.general.haproxy) for the fleet's needs. That module waits with C(drain) for
    C(scur=0) even when enabling (community.general#12286, the wait never ends under load), waits for the status
    text C(DRAIN) that a DOWN server never shows (#8092), silently does nothing for an unknown server unless
    C(fail_on_not_found), and fails a wait without saying what it saw.
  - Here the admin state (READY/DRAIN/MAINT) is read from C(show servers state) (flags, so a DOWN server in drain
    is seen as draining), sessions and health from C(show stat).
  - C(state=drain) + C(wait) waits until the servers have no current session (C(scur)) and nothing queued
    (C(qcur)), whatever their health. A server already in MAINT is left in MAINT.
  - C(state=ready) + C(wait) waits until HAProxy reports each server C(UP) (health checks passed).
  - C(state=limit) sets each server's maxconn to O(maxconn) (C(set maxconn server)); with C(wait), until every
    server reports it (a vllm-watchdog agent sets it again at every check, so it must say the same).
  - After a change, runs O(save_state) so that the server-state file (read by HAProxy at reload/start) is current.
  - Check mode reports what would change.
options:
  socket: {description: Path of the admin socket., type: path, default: /run/haproxy/admin.sock}
  backend: {description: Backend name; all backends when omitted., type: str}
  servers:
    description: Server names. Required unless O(state=query) (then all servers).
    type: list
    elements: str
    default: []
  state:
    description: C(query) only reads; C(ready), C(drain), C(maint) set the admin state (C(set server ... state));
      C(limit) sets maxconn.
    type: str
    choices: [query, ready, drain, maint, limit]
    default: query
  maxconn: {description: "With O(state=limit), the servers' maxconn (from 1).", type: int}
  wait: {description: Wait for the condition of O(state) (see above)., type: bool, default: true}
  timeout: {description: Seconds to wait., type: int, default: 60}
  interval: {description: Seconds between polls., type: float, default: 1.0}
  on_timeout:
    description: With O(state=drain), C(fail) leaves the servers in DRAIN and fails, C(continue) returns
      C(timed_out=true) without failing.
    type: str
    choices: [fail, continue]
    default: fail
  save_state:
    description: Command (argv) run after a change to save the servers' state (empty list to skip).
    type: list
    elements: str
    default: []
author: vllm-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Drain, wait until no session is left
  vllm_fleet.fleet.haproxy_servers:
    backend: vllm
    servers: [gpu-01-main]
    state: drain
    timeout: 300
  delegate_to: lb-01

- name: Servers of every backend, with state and sessions
  vllm_fleet.fleet.haproxy_servers:
  register: lb
  delegate_to: lb-01
"""

RETURN = r"""
servers:
  description: The servers (all when O(servers) is empty), after the change.
  returned: always
  type: list
  elements: dict
  contains:
    backend: {description: Backend name., type: str}
    name: {description: Server name., type: str}
    state: {description: "MAINT, DRAIN, UP (ready and healthy), DOWN, or NOLB.", type: str}
    admin: {description: "ready, drain or maint (admin state only).", type: str}
    status: {description: "HAProxy's status text (e.g. UP, UP 1/2, DOWN, MAINT, DRAIN).", type: str}
    scur: {description: Current sessions., type: int}
    qcur: {description: Queued requests., type: int}
    slim: {description: "The server's maxconn (0: none).", type: int}
    smax: {description: The most sessions it had at once (since HAProxy started or its counters were cleared)., type: int}
    check_status: {description: "Last health check result (e.g. L7OK, L4CON).", type: str}
    addr: {description: "address:port.", type: str}
backends:
  description: With O(state=query), each backend's queue and refusals.
  returned: when O(state=query)
  type: list
  elements: dict
  contains:
    backend: {description: Backend name., type: str}
    qcur: {description: "Requests waiting in the backend's queue for a server's slot (every server at its maxconn).",
           type: int}
    qmax: {description: The most that waited at once., type: int}
    hrsp_5xx: {description: "5xx answers, the queue's 503 (no slot within timeout queue) included.", type: int}
changed_servers: {description: "Names of the servers whose admin state or maxconn was changed.", returned: always,
                  type: list}
timed_out:
  description: True when the wait ended on the timeout (O(on_timeout=continue)).
  returned: always
  type: bool
elapsed: {description: Seconds spent., returned: always, type: float}
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.haproxy_admin import (
    AdminSocketError, command, parse_servers_state, parse_stat, servers_state)

ADMF_MAINT = 0x23  # FMAINT | IMAINT | RMAINT (CMAINT alone is only "was disabled in the configuration")
ADMF_DRAIN = 0x18  # FDRAIN | IDRAIN
OP_STATES = {0: "DOWN", 1: "DOWN", 2: "UP", 3: "NOLB"}  # stopped, starting, running, stopping


def backends(path, backend):
    """What a backend queues and refuses: [{backend, qcur (requests waiting for a slot now), qmax, hrsp_5xx}]."""
    rows = parse_stat(command(path, "show stat"), "BACKEND")
    return [{"backend": name, "qcur": to_int(row.get("qcur")), "qmax": to_int(row.get("qmax")),
             "hrsp_5xx": to_int(row.get("hrsp_5xx"))}
            for (name, _server), row in sorted(rows.items()) if backend is None or name == backend]


def to_int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def snapshot(path):
    """Every server: [{backend, name, state, admin, status, scur, qcur, check_status, addr}]."""
    stat = parse_stat(command(path, "show stat"))
    # The admin state's flags tell drain from maint where `show stat`'s status does not (a DOWN server in drain).
    states = {(row["be_name"], row["srv_name"]): (int(row["srv_op_state"]), int(row["srv_admin_state"]))
              for row in parse_servers_state(servers_state(path), fields=7)
              if row["srv_op_state"].isdigit() and row["srv_admin_state"].isdigit()}
    servers = []
    for (backend, name), row in stat.items():
        op_state, admin_flags = states.get((backend, name), (None, 0))
        admin = "maint" if admin_flags & ADMF_MAINT else "drain" if admin_flags & ADMF_DRAIN else "ready"
        status = row.get("status", "")
        if admin == "maint":
            state = "MAINT"
        elif admin == "drain":
            state = "DRAIN"
        elif op_state is not None:
            state = OP_STATES.get(op_state, "DOWN")
        else:
            state = status.split(" ")[0]
        servers.append({
            "backend": backend, "name": name, "state": state, "admin": admin, "status": status,
            "scur": to_int(row.get("scur")), "qcur": to_int(row.get("qcur")), "slim": to_int(row.get("slim")),
            "smax": to_int(row.get("smax")),
            "check_status": row.get("check_status", ""), "addr": row.get("addr", ""),
        })
    return servers


def select(servers, backend, names):
    return [s for s in servers if (backend is None or s["backend"] == backend) and (not names or s["name"] in names)]


def describe(servers):
    return ", ".join(f"{s['backend']}/{s['name']}={s['status'] or s['state']} (admin {s['admin']}, scur {s['scur']}, "
                     f"qcur {s['qcur']}, maxconn {s['slim'] or '-'}, check {s['check_status'] or '-'})"
                     for s in servers)


def condition_met(state, server, maxconn=None):
    if state == "drain":
        return server["admin"] == "maint" or (server["scur"] == 0 and server["qcur"] == 0)
    if state == "ready":
        return server["admin"] == "ready" and server["status"] == "UP"
    if state == "limit":
        return server["slim"] == maxconn
    return server["admin"] == state


def needs_change(state, server, maxconn=None):
    if state == "limit":
        return server["slim"] != maxconn
    if state == "drain":
        return server["admin"] == "ready"  # DRAIN stays, MAINT is already further than DRAIN
    return server["admin"] != state


def main():
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "default": "/run/haproxy/admin.sock"},
            "backend": {"type": "str"},
            "servers": {"type": "list", "elements": "str", "default": []},
            "state": {"type": "str", "choices": ["query", "ready", "drain", "maint", "limit"], "default": "query"},
            "maxconn": {"type": "int"},
            "wait": {"type": "bool", "default": True},
            "timeout": {"type": "int", "default": 60},
            "interval": {"type": "float", "default": 1.0},
            "on_timeout": {"type": "str", "choices": ["fail", "continue"], "default": "fail"},
            "save_state": {"type": "list", "elements": "str", "default": []},
        },
        required_if=[("state", "ready", ["servers"]), ("state", "drain", ["servers"]), ("state", "maint", ["servers"]),
                     ("state", "limit", ["servers", "maxconn"])],
        supports_check_mode=True,
    )
    path, backend, names, state = (module.params[k] for k in ("socket", "backend", "servers", "state"))
    maxconn = module.params["maxconn"]
    if state == "limit" and maxconn < 1:
        module.fail_json(msg=f"maxconn must be at least 1, got {maxconn}")
    started = time.monotonic()
    result = {"changed": False, "changed_servers": [], "timed_out": False}

    try:
        current = select(snapshot(path), backend, names)
        missing = sorted(set(names) - {s["name"] for s in current})
        if missing:
            known = sorted({f"{s['backend']}/{s['name']}" for s in select(snapshot(path), backend, [])})
            module.fail_json(msg=f"server(s) {', '.join(missing)} not found in backend {backend or '(any)'} of "
                                 f"{path}; servers there: {', '.join(known) or 'none'}", **result)
        if state == "query":
            module.exit_json(servers=current, backends=backends(path, backend),
                             elapsed=round(time.monotonic() - started, 3), **result)

        to_change = [s for s in current if needs_change(state, s, maxconn)]
        result["changed_servers"] = sorted({s["name"] for s in to_change})
        result["changed"] = bool(to_change)
        if module.check_mode:
            module.exit_json(servers=current, elapsed=0.0, **result)

        for server in to_change:
            cmd = (f"set maxconn server {server['backend']}/{server['name']} {maxconn}" if state == "limit" else
                   f"set server {server['backend']}/{server['name']} state {state}")
            answer = command(path, cmd).strip()
            if answer:
                module.fail_json(msg=f"`{cmd}`: {answer}", **result)
        if to_change and module.params["save_state"] and state != "limit":
            rc, out, err = module.run_command(module.params["save_state"])
            if rc != 0:
                module.fail_json(msg=f"state changed but saving it failed (rc {rc}): {err or out}", **result)

        deadline = started + module.params["timeout"]
        current = select(snapshot(path), backend, names)
        while module.params["wait"] and not all(condition_met(state, s, maxconn) for s in current):
            if time.monotonic() >= deadline:
                result["timed_out"] = True
                waited = {"drain": "no session left", "ready": "UP", "maint": "MAINT",
                          "limit": f"maxconn {maxconn}"}[state]
                late = [s for s in current if not condition_met(state, s, maxconn)]
                msg = f"after {module.params['timeout']} s, not {waited} yet: {describe(late)}"
                if state == "drain" and module.params["on_timeout"] == "continue":
                    module.warn(msg)
                    break
                module.fail_json(msg=msg, servers=current, elapsed=round(time.monotonic() - started, 3), **result)
            time.sleep(module.params["interval"])
            current = select(snapshot(path), backend, names)
    except AdminSocketError as exc:
        module.fail_json(msg=str(exc), **result)

    module.exit_json(servers=current, elapsed=round(time.monotonic() - started, 3), **result)


if __name__ == "__main__":
    main()
