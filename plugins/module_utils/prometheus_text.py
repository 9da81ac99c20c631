# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Prometheus text exposition format: its one reader and its one writer.

Read: vLLM's /metrics (through vllm_metrics.py) and node exporter's textfiles (the watchdog reads the OOM counter's).
Written: the textfiles of the host agents (vllm-watchdog, vllm-oom-counter, nvidia-gpu-health), which node exporter's
textfile collector serves. Standard library only and no Ansible import: the modules import it by namespace, the host
agents from a copy installed next to them.
"""
from __future__ import annotations

import math
import os
import re

# name, then labels in braces (values are quoted and may hold "}", "," and escaped quotes), then the value and an
# optional timestamp.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,?)')
_VALUE = re.compile(r"\s+(\S+)(?:\s+-?\d+)?\s*$")
_UNESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
_KINDS = ("counter", "gauge", "histogram", "summary", "untyped")


def samples(text):
    """(name, {label: value}, float value) of every sample of a Prometheus text exposition, in order.

    Comments, malformed lines and NaN are skipped."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = _NAME.match(line)
        if not name:
            continue
        rest, labels = line[name.end():], {}
        if rest.startswith("{"):
            rest = rest[1:]
            while True:
                label = _LABEL.match(rest)
                if not label:
                    break
                labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPES[m.group(0)], label.group(2))
                rest = rest[label.end():]
                if not label.group(3):
                    break
            rest = rest.lstrip()
            if not rest.startswith("}"):
                continue
            rest = rest[1:]
        value = _VALUE.match(rest)
        if not value:
            continue
        try:
            number = float(value.group(1))
        except ValueError:
            continue
        if not math.isnan(number):
            yield name.group(0), labels, number


def _value(number):
    if isinstance(number, bool):
        return "1" if number else "0"
    if isinstance(number, int) or (isinstance(number, float) and number.is_integer()):
        return "%d" % number
    return repr(float(number))


def family(name, kind, help_text, rows):
    """The lines of one metric family: HELP, TYPE, then a sample per (labels dict, value) of rows.

    Label values are escaped as the format asks (backslash, double quote, newline), so any text can be one; help
    text is one line (a newline in it is escaped too)."""
    if not _NAME.fullmatch(name) or kind not in _KINDS:
        raise ValueError("not a metric name and type: %r %r" % (name, kind))
    help_line = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    lines = ["# HELP %s %s" % (name, help_line), "# TYPE %s %s" % (name, kind)]
    for labels, number in rows:
        text = ",".join('%s="%s"' % (key, re.sub(r'[\\"\n]', lambda m: _ESCAPES[m.group(0)], str(value)))
                        for key, value in labels.items())
        lines.append("%s%s %s" % (name, "{%s}" % text if text else "", _value(number)))
    return lines


def render(families):
    """A whole exposition (a textfile) from the line lists of family()."""
    return "".join(line + "\n" for lines in families for line in lines)


def write_whole(path, text):
    """Write a file whole (a temporary file renamed over it): a reader (node exporter, a task reading an agent's state)
    never sees half of it. The temporary name does not end in .prom, so node exporter never reads it."""
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)
