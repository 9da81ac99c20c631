# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of the kernel's NVIDIA lines: /dev/kmsg records, the NVRM messages in them (Xid, SXid, "fallen
off the bus", Xid 154's recovery action) and their PCI addresses, and NVIDIA's Xid catalog that classifies them.

Used by nvidia-gpu-health (the host agent, files/nvidia-gpu-health, which gets a copy next to it) and by the tests.

/dev/kmsg record (the kernel's Documentation/ABI/testing/dev-kmsg): "<prio>,<seq>,<usec>,<flags>[,...];<text>\\n"
then optional continuation lines starting with a space (" SUBSYSTEM=pci"). Real NVRM messages, as the driver prints
them (tests/fixtures/nvidia-kmsg/ names each line's source):
  NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response ...
  NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
  NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.                      (R570 on: no pid, no name)
  NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.
  NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)
  nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up
  NVRM: Xid (0000:03:00): 14, Channel 00000001                                      (old drivers: no "PCI:")
"""
from __future__ import annotations

import re

_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
# "(PCI:0000:9b:00)", "(PCI:0000:01:00 GPU-I:05)" (a MIG instance), "(0000:03:00)" (old drivers).
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?(?: [^)]*)?\): "
                  r"(\d+)(?:, (.*))?$")
_SXID = re.compile(r"^(nvidia-nvswitch\d+): SXid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\): "
                   r"(\d+)(?:, (.*))?$")
_FALLEN = re.compile(r"NVRM: GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?: GPU has fallen off the "
                     r"bus\.?$")
# Probe-time form (one printk with embedded newlines, as NVIDIA/NVSentinel#155 shows): "NVRM: The NVIDIA GPU
# 0000:b3:00.0 ... has ... fallen off the bus and is not responding to commands."
_FALLEN_PROBE = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\b.*"
                           r"fallen off the bus", re.S)
_PROCESS = re.compile(r"^pid=('?[^,]*'?)(?:, name=([^,]*))?, ?")
_RECOVERY = re.compile(r"GPU recovery action changed from 0x([0-9A-Fa-f]+) \(([^)]*)\) to 0x([0-9A-Fa-f]+) "
                       r"\(([^)]*)\)")


def pci_key(address):
    """One spelling for a GPU's PCI address: the kernel's "0000:9b:00" / "0000:91:00.0" and nvidia-smi's
    "00000000:9B:00.0" all give "0000:9b:00" (domain, bus, device; the function is always 0 for a GPU)."""
    match = re.match(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?$", address.strip())
    if not match:
        raise ValueError("not a PCI address: %r" % address)
    domain, bus, device = match.groups()
    return "%04x:%s:%s" % (int(domain, 16), bus.lower(), device.lower())


def parse_record(line):
    """(level, seq, usec, text) of one /dev/kmsg record line; None for a continuation line or anything else."""
    match = _RECORD.match(line.rstrip("\n"))
    if not match:
        return None
    prio, seq, usec, text = match.groups()
    return int(prio) & 7, int(seq), int(usec), text


def parse_nvrm(text):
    """The NVIDIA event a kernel message reports, or None:
    {"kind": "xid" | "sxid" | "fallen", "xid": int | None, "pci": "0000:9b:00", "pid": str | None,
     "process": str | None, "detail": str, "recovery": (from_code, from_label, to_code, to_label) for Xid 154}."""
    match = _XID.search(text)
    if match:
        pci, xid, rest = match.group(1), int(match.group(2)), match.group(3) or ""
        pid = process = None
        proc = _PROCESS.match(rest)
        if proc:
            pid, process = proc.group(1).strip("'"), proc.group(2)
            rest = rest[proc.end():]
        event = {"kind": "xid", "xid": xid, "pci": pci_key(pci), "pid": pid, "process": process, "detail": rest}
        recovery = _RECOVERY.search(rest) if xid == 154 else None
        if recovery:
            event["recovery"] = (int(recovery.group(1), 16), recovery.group(2), int(recovery.group(3), 16),
                                 recovery.group(4))
        return event
    match = _SXID.search(text)
    if match:
        return {"kind": "sxid", "xid": int(match.group(3)), "pci": pci_key(match.group(2)), "pid": None,
                "process": None, "detail": match.group(4) or "", "switch": match.group(1)}
    match = _FALLEN.search(text) or _FALLEN_PROBE.search(text)
    if match:
        return {"kind": "fallen", "xid": None, "pci": pci_key(match.group(1)), "pid": None, "process": None,
                "detail": "GPU has fallen off the bus"}
    return None


# NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Ampere and newer):
# each Xid's "immediate action" bucket, verbatim, as transcribed for Xids 1-172 in
# leptonai/gpud@4a8de33a3f02e207f39e9023d67125592d599731:components/accelerator/nvidia/xid/catalog_generated.go
# (generated from that page on 2025-10-29). Xids 162-172 have no bucket there; Xids absent from the catalog
# are "unknown": reported and counted, never fenced, until nvidia_gpu_health_xid_classes names their class.
CATALOG_BUCKETS = {
    "RESTART_APP": (8, 11, 13, 25, 31, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72, 75, 76, 77, 80, 82, 83, 84, 85, 86, 88,
                    89, 94, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 126, 127, 128, 129, 130, 131, 132, 133, 134,
                    135, 139),
    "IGNORE": (14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 108, 121, 137, 141, 152, 153, 157, 160, 161),
    "WORKFLOW_XID_45": (45,),
    "RESET_GPU": (46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158),
    "WORKFLOW_XID_48": (48,),
    "WORKFLOW_NVLINK_ERR": (74,),
    "WORKFLOW_NVLINK5_ERR": (144, 145, 146, 147, 148, 149, 150),
    "CHECK_UVM": (159,),
    "RESTART_BM": (79,),
    "RESTART_VM": (151,),
    "CHECK_MECHANICALS": (54,),
    "UPDATE_SWFW": (78,),
    "XID_154": (154,),
    # Unused on Ampere and later (not expected), and 142 (NVENC3 error).
    "CONTACT_SUPPORT": (1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 27, 28, 29, 30, 33,
                        34, 35, 36, 42, 47, 49, 50, 51, 52, 53, 55, 56, 57, 58, 59, 61, 65, 73, 81, 87, 90, 91, 111, 112,
                        113, 114, 115, 116, 117, 118, 122, 123, 124, 125, 138, 142),
    "": (162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172),
}
BUCKET_OF = {xid: bucket for bucket, xids in CATALOG_BUCKETS.items() for xid in xids}
# What each bucket asks of an inference host. "application": restarting the application is enough (vLLM and
# systemd do it) or nothing is needed. "reset": the GPU is unusable until reset (nvidia-smi -r); the 48/74/NVLink5
# workflows and CHECK_UVM resolve to a reset (vLLM's CUDA uses UVM). "reboot": the host (a power cycle, service).
BUCKET_CLASS = {
    "RESTART_APP": "application", "IGNORE": "application", "WORKFLOW_XID_45": "application",
    "RESET_GPU": "reset", "WORKFLOW_XID_48": "reset", "WORKFLOW_NVLINK_ERR": "reset", "WORKFLOW_NVLINK5_ERR": "reset",
    "CHECK_UVM": "reset",
    "RESTART_BM": "reboot", "RESTART_VM": "reboot", "CHECK_MECHANICALS": "reboot", "UPDATE_SWFW": "reboot",
    "CONTACT_SUPPORT": "reboot",
}
# Xid 154 states the action itself, by its NVML code (nvmlDeviceGpuRecoveryAction_t: the labels changed across
# driver branches, "GPU Reset Required" became "PF FLR" in R610): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
# 4 drain and reset, 5 recover the IMEX domain, 6 bus reset, 7 system reboot.
RECOVERY_CLASS = {0: "application", 1: "reset", 2: "reboot", 3: "reset", 4: "reset", 5: "reboot", 6: "reset",
                  7: "reboot"}
CLASSES = ("application", "reset", "reboot", "unknown")
# Worst first: a GPU keeps the worst class any of its events asked for.
SEVERITY = {"unknown": 0, "application": 1, "reset": 2, "reboot": 3}


def classify(event, overrides=None):
    """(class, NVIDIA's bucket or what decided) of a parse_nvrm event; overrides: {xid: class} from the inventory."""
    overrides = overrides or {}
    if event["kind"] == "fallen":
        return "reboot", "RESTART_BM (GPU has fallen off the bus, as Xid 79)"
    if event["kind"] == "sxid":
        # An NVSwitch error concerns the NVLink fabric, not one GPU: the caller applies it to every GPU of the host.
        fatal = event["detail"].startswith("Fatal")
        return ("reboot" if fatal else "application"), "SXid %s (%s)" % (event["xid"], "fatal" if fatal else "non-fatal")
    xid = event["xid"]
    if xid in overrides:
        return overrides[xid], "nvidia_gpu_health_xid_classes"
    if xid == 154 and "recovery" in event:
        code = event["recovery"][2]
        return RECOVERY_CLASS.get(code, "unknown"), "XID_154 recovery action 0x%x (%s)" % (code, event["recovery"][3])
    bucket = BUCKET_OF.get(xid)
    if not bucket:
        return "unknown", "not in NVIDIA's Xid catalog" if bucket is None else "no action in NVIDIA's Xid catalog"
    return BUCKET_CLASS.get(bucket, "unknown"), bucket
