# -*- coding: utf-8 -*-
"""`systemctl show UNIT -p A,B,...` output: the one reader of that format.

Used by the vllm_ready and vllm_diagnose modules and by the watchdog daemon on each host (which gets a copy of this
file next to it). Standard library only, no Ansible import.
"""
from __future__ import annotations


def show_command(unit, properties):
    """The argv that asks systemd for `properties` (a sequence of names) of `unit`."""
    return ["systemctl", "show", unit, "-p", ",".join(properties)]


def parse_show(text):
    """{property: value} of `systemctl show` output (KEY=VALUE lines; values may hold "=")."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
