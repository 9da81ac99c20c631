# -*- coding: utf-8 -*-
"""systemd's two formats the project reads: `systemctl show UNIT -p A,B,...` and the journal (journalctl).

Used by the vllm_ready, vllm_diagnose and vllm_loadtest modules and by the watchdog and the OOM counter on each host
(which get a copy of this file next to them). The journal's lines themselves are vLLM's, read by vllm_log.py.
Standard library only, no Ansible import.
"""
from __future__ import annotations


def show_command(unit, properties):
    """The argv that asks systemd for `properties` (a sequence of names) of `unit`."""
    return ["systemctl", "show", unit, "-p", ",".join(properties)]


def parse_show(text):
    """{property: value} of `systemctl show` output (KEY=VALUE lines; values may hold "=")."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def journal_command(unit=None, invocation=None, since=None, after_cursor=None, lines=None, output="short-iso",
                    show_cursor=False):
    """The argv of every journal read: a unit's (or one invocation's) lines since a time or after a cursor (else
    since this boot when a cursor is asked for), the last `lines`, in an output vllm_log reads (short-iso: every line,
    systemd's own included, carries its date and time; cat: the messages alone)."""
    argv = ["journalctl", "--no-pager", "-o", output]
    if unit:
        argv += ["-u", unit]
    if invocation:
        argv.append("_SYSTEMD_INVOCATION_ID=" + invocation)
    if since:
        argv += ["--since", since]
    if after_cursor:
        argv += ["--after-cursor", after_cursor]
    elif show_cursor:
        argv.append("-b")
    if lines:
        argv += ["-n", str(int(lines))]
    if show_cursor:
        argv.append("--show-cursor")
    return argv


def split_cursor(text):
    """(the lines, the cursor) of a read with show_cursor; the cursor is None when nothing new was logged."""
    lines = text.splitlines()
    if lines and lines[-1].startswith("-- cursor: "):
        return "\n".join(lines[:-1]), lines[-1][len("-- cursor: "):]
    return "", None
