# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of nvidia-smi's CSV output (--query-*=... --format=csv[,noheader][,nounits]): its rows, its
placeholders, and the queries of the GPUs' PCI addresses and remapped rows. Used by the nvidia_gpu_facts module and
by nvidia-gpu-health (files/) and the vllm role's vllm-unit-helper, which each get it installed next to them."""
from __future__ import annotations

import csv
import re

_UNAVAILABLE_RE = re.compile(r"^\[[^\]]*\]$")


class NvidiaSmiParseError(ValueError):
    """nvidia-smi printed something this module cannot read."""


def is_unavailable(value):
    """True for nvidia-smi's placeholders: [N/A], [Not Supported], [Unknown Error], plain N/A..."""
    value = value.strip()
    return value in ("", "N/A") or bool(_UNAVAILABLE_RE.match(value))


def split_row(line, fields, free_field=None):
    """Split one unquoted nvidia-smi CSV row into len(fields) values.

    nvidia-smi joins values with ", " and never quotes them, so a value containing ", " yields extra pieces.
    Those are joined back into free_field, the only column whose content is free text; every other column
    has a fixed shape. A quoted row (should a future nvidia-smi quote) is read with the csv module.
    """
    count = len(fields)
    if '"' in line:
        quoted = next(csv.reader([line], skipinitialspace=True))
        if len(quoted) == count:
            return [value.strip() for value in quoted]
    parts = line.split(", ")
    if len(parts) < count:
        # Tolerate a bare "," separator.
        parts = line.split(",")
    if len(parts) > count and free_field is not None:
        start = fields.index(free_field)
        after = count - start - 1
        end = len(parts) - after
        parts = parts[:start] + [", ".join(parts[start:end])] + parts[end:]
    if len(parts) != count:
        raise NvidiaSmiParseError(
            "expected %d comma-separated values (%s), got %d in line %r"
            % (count, ",".join(fields), len(parts), line)
        )
    return [part.strip() for part in parts]


def data_lines(text, fields):
    """Non-empty lines, without a header line should one be present (its first value is the field name)."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and stripped.split(",")[0].strip() != fields[0]:
            yield stripped


BUS_QUERY_FIELDS = ("index", "pci.bus_id", "uuid")
REMAP_QUERY_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")
_YES_NO = {"yes": True, "no": False}


def parse_bus_csv(text):
    """[{index, pci_bus_id, uuid}] of `nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader`."""
    out = []
    for line in data_lines(text, BUS_QUERY_FIELDS):
        index, bus_id, uuid = split_row(line, BUS_QUERY_FIELDS)
        if not index.isdigit():
            raise NvidiaSmiParseError("index is not an integer: %r in line %r" % (index, line))
        out.append({"index": int(index), "pci_bus_id": bus_id, "uuid": uuid})
    return out


def parse_remap_csv(text):
    """[{pci_bus_id, pending, failure}] of `nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.pending,
    remapped_rows.failure --format=csv,noheader`: Yes/No as booleans, None where the GPU has no row remapper
    ([N/A], pre-Ampere)."""
    out = []
    for line in data_lines(text, REMAP_QUERY_FIELDS):
        bus_id, pending, failure = split_row(line, REMAP_QUERY_FIELDS)
        out.append({"pci_bus_id": bus_id, "pending": _YES_NO.get(pending.strip().lower()),
                    "failure": _YES_NO.get(failure.strip().lower())})
    return out
