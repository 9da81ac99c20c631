# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HAProxy's admin socket (`stats socket ... level admin`): its one client and the one reader of its answers.

Used by the haproxy_servers module (drain, enable, the valve's maxconn, status) and by the balancer's
haproxy-server-state program (roles/balancer/files, which gets a copy of this file next to it; it also reads the
server-state file, which is `show servers state`'s answer saved). Standard library only, no Ansible import.
"""
from __future__ import annotations

import csv
import socket

# `show servers state` version 1 (HAProxy 1.6+): the fields in the order HAProxy prints them; later versions add
# fields after these (2.2+: srv_use_ssl, srv_check_port, ...), which are kept as they are.
SERVERS_STATE_FIELDS = (
    "be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
    "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord").split()


class AdminSocketError(OSError):
    """The socket did not answer, or answered something that is not what the command prints."""


def command(path, cmd, timeout=10.0):
    """Send one command to the admin socket and return the whole answer (HAProxy closes after it)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(cmd.encode() + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as exc:
        raise AdminSocketError(f"HAProxy admin socket {path}: {exc}") from exc
    return b"".join(chunks).decode("utf-8", "replace")


def parse_servers_state(text, fields=len(SERVERS_STATE_FIELDS)):
    """[{field: word}] of `show servers state`'s answer or of a server-state file (version 1; [] for any other).

    A line needs at least `fields` of SERVERS_STATE_FIELDS (all of them by default: a state file is written back
    from them); the words after the known fields are kept in order under "_extra"."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "1":
        return []
    rows = []
    for line in lines[1:]:
        words = line.split()
        if not words or words[0].startswith("#") or len(words) < fields:
            continue
        row = dict(zip(SERVERS_STATE_FIELDS, words))
        row["_extra"] = words[len(SERVERS_STATE_FIELDS):]
        rows.append(row)
    return rows


def servers_state(path, timeout=10.0):
    """The text of `show servers state`, refused unless it is version 1 (what parse_servers_state reads)."""
    text = command(path, "show servers state", timeout)
    if not text.startswith("1\n"):
        raise AdminSocketError(f"unexpected answer to `show servers state` from {path}: {text[:200]!r}")
    return text


def parse_stat(text, kind="servers"):
    """{(proxy, name): row} from `show stat` CSV: the servers, or the backends' own rows (kind="BACKEND")."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise AdminSocketError(f"unexpected `show stat` answer: {text[:200]!r}")
    lines[0] = lines[0][2:]
    rows = {}
    for row in csv.DictReader(lines):
        own = row.get("svname") in ("FRONTEND", "BACKEND")
        if row.get("pxname") and (row.get("svname") == kind if kind != "servers" else not own):
            rows[(row["pxname"], row["svname"])] = row
    return rows
