"""plugins/module_utils/nvidia_kmsg.py on real NVIDIA kernel lines (tests/fixtures/nvidia-kmsg, each with
its source), and nvidia-gpu-health (roles/nvidia_gpu/files) end to end on a kernel log in /dev/kmsg's format
written by the stand-in (tests/fixtures/kernel-log), with the nvidia-smi stand-in."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import load_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_gpu"
MODULE_UTILS = ROOT / "plugins" / "module_utils"
# On a host the program's module_utils sit next to it; here they are the collection's own files (pytest.ini).

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import nvidia_kmsg as k  # noqa: E402

LINES = [line for line in (ROOT / "tests" / "fixtures" / "nvidia-kmsg" / "nvrm-lines.txt").read_text().splitlines()
         if line and not line.startswith("#")]

# The start of each fixture line -> (kind, Xid, PCI key, class), None for a line that reports no fault.
EXPECTED = {
    "NVRM: GPU at PCI:0000:9b:00": None,
    "NVRM: Xid (PCI:0000:9b:00): 119": ("xid", 119, "0000:9b:00", "reset"),
    "NVRM: Rate limiting GSP": None,
    "NVRM: Xid (PCI:0000:cb:00): 13": ("xid", 13, "0000:cb:00", "application"),
    "NVRM: Xid (PCI:0000:cb:00): 109": ("xid", 109, "0000:cb:00", "reset"),
    "NVRM: Xid (PCI:0000:cb:00): 31": ("xid", 31, "0000:cb:00", "application"),
    "NVRM: Xid (PCI:0000:91:00): 79": ("xid", 79, "0000:91:00", "reboot"),
    "NVRM: GPU 0000:91:00.0: GPU has fallen": ("fallen", None, "0000:91:00", "reboot"),
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal": ("sxid", 20034, "0000:05:00", "reboot"),
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity": ("sxid", 20034, "0000:07:00", "application"),
    "NVRM: Xid (PCI:0009:01:00): 43": ("xid", 43, "0009:01:00", "application"),
    "NVRM: Xid (PCI:0000:01:00): 32": ("xid", 32, "0000:01:00", "application"),
    "NVRM: Xid (PCI:0009:01:00): 154": ("xid", 154, "0009:01:00", "reset"),
    "NVRM: Xid (PCI:0019:01:00): 154": ("xid", 154, "0019:01:00", "reset"),
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028": ("sxid", 12028, "0000:05:00", "application"),
    "NVRM: Xid (PCI:0000:07:00): 48": ("xid", 48, "0000:07:00", "reset"),
    "NVRM: Xid (PCI:0000:01:00): 79": ("xid", 79, "0000:01:00", "reboot"),
    "NVRM: Xid (PCI:0000:01:00): 154": ("xid", 154, "0000:01:00", "reset"),
    "NVRM: Xid (PCI:0000:dc:00): 45": ("xid", 45, "0000:dc:00", "application"),
    "NVRM: Xid (PCI:0003:00:00): 74": ("xid", 74, "0003:00:00", "reset"),
    "NVRM: Xid (PCI:0008:01:00): 154": ("xid", 154, "0008:01:00", "application"),
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94": ("xid", 94, "0000:01:00", "application"),
    "NVRM: Xid (PCI:0000:01:00): 95": ("xid", 95, "0000:01:00", "reset"),
    "NVRM: Xid (0000:03:00): 14": ("xid", 14, "0000:03:00", "application"),
    "NVRM: The NVIDIA GPU 0000:b3:00.0": ("fallen", None, "0000:b3:00", "reboot"),
}


def expected_for(line):
    keys = [key for key in EXPECTED if line.startswith(key)]
    assert len(keys) == 1, "no single expectation for fixture line %r" % line
    return EXPECTED[keys[0]]


@pytest.mark.parametrize("line", LINES)
def test_every_real_line_is_read_and_classified(line):
    event = k.parse_nvrm(line)
    expected = expected_for(line)
    if expected is None:
        assert event is None
        return
    assert (event["kind"], event["xid"], event["pci"], k.classify(event)[0]) == expected


def test_every_expectation_has_its_real_line():
    assert {key for key in EXPECTED if any(line.startswith(key) for line in LINES)} == set(EXPECTED)


def test_process_fields_and_recovery_codes():
    event = k.parse_nvrm(LINES[1])
    assert (event["pid"], event["process"], event["detail"][:12]) == ("2024380", "nvidia-smi", "Timeout afte")
    unknown = k.parse_nvrm(next(line for line in LINES if ": 13, " in line))
    assert (unknown["pid"], unknown["process"]) == ("<unknown>", "<unknown>")
    flr = k.parse_nvrm(next(line for line in LINES if "PF FLR" in line))
    assert flr["recovery"] == (0, "None", 1, "PF FLR")
    assert k.classify(flr) == ("reset", "XID_154 recovery action 0x1 (PF FLR)")


def test_every_catalog_xid_has_one_bucket_and_every_bucket_a_class():
    xids = [xid for xids in k.CATALOG_BUCKETS.values() for xid in xids]
    assert sorted(xids) == list(range(1, 173))
    assert set(k.CATALOG_BUCKETS) - {"", "XID_154"} == set(k.BUCKET_CLASS)


def test_unknown_xids_are_not_fenced_unless_the_inventory_says_so():
    event = {"kind": "xid", "xid": 173, "pci": "0000:01:00", "detail": ""}
    assert k.classify(event) == ("unknown", "not in NVIDIA's Xid catalog")
    assert k.classify(dict(event, xid=167))[0] == "unknown"
    assert k.classify(event, {173: "reboot"}) == ("reboot", "nvidia_gpu_health_xid_classes")


def test_records_and_pci_addresses():
    assert k.parse_record("4,1227,437812449,c,1,-;NVRM: Xid (PCI:0000:01:00): 43, pid=1, name=x, Ch 00000018") == (
        4, 1227, 437812449, "NVRM: Xid (PCI:0000:01:00): 43, pid=1, name=x, Ch 00000018")
    assert k.parse_record(" SUBSYSTEM=pci") is None
    for spelling in ("00000000:9B:00.0", "0000:9b:00", "0000:9b:00.0"):
        assert k.pci_key(spelling) == "0000:9b:00"
    with pytest.raises(ValueError):
        k.pci_key("9b:00")


# --- nvidia-gpu-health end to end ---------------------------------------------------------------------------------


def load_daemon():
    return load_file(ROLE / "files" / "nvidia-gpu-health", "nvidia_gpu_health")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host with two A10Gs (the nvidia-smi stand-in), a kernel log in /dev/kmsg's format, one vLLM instance
    registered on GPU 1, and a systemctl that records what it is asked."""
    gpus = {"driver_version": "550.144.03", "gpus": [
        {"index": i, "name": "NVIDIA A10G", "uuid": "GPU-%d" % i, "memory_total_mib": 23028, "memory_used_mib": 0,
         "compute_capability": "8.6", "mig_mode": None, "pci_bus_id": "00000000:00:1%s.0" % "EF"[i],
         "minor_number": i} for i in (0, 1)]}
    (tmp_path / "gpus.json").write_text(json.dumps(gpus))
    monkeypatch.setenv("NVIDIA_SMI_STANDIN", str(tmp_path / "gpus.json"))
    (tmp_path / "units.d").mkdir()
    (tmp_path / "units.d" / "vllm.json").write_text(json.dumps([{"unit": "vllm@main.service", "gpus": [1]}]))
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho \"$@\" >> %s/systemctl.log\n" % tmp_path)
    systemctl.chmod(0o755)
    (tmp_path / "kmsg").touch()
    config = {"kmsg": str(tmp_path / "kmsg"), "interval": 1, "remap_interval": 0,
              "state_file": str(tmp_path / "state" / "state.json"), "units_dir": str(tmp_path / "units.d"),
              "textfile": str(tmp_path / "gpu.prom"), "nvidia_smi": str(ROOT / "tests" / "fixtures" / "nvidia-smi"),
              "xid_classes": {}, "systemctl": str(systemctl)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def kernel_says(host, text):
    subprocess.run([str(ROOT / "tests" / "fixtures" / "kernel-log"), text], check=True,
                   env=dict(os.environ, KMSG_STANDIN=str(host / "kmsg")))


def state(host):
    return json.loads((host / "state" / "state.json").read_text())


def test_an_application_xid_is_counted_and_a_fatal_one_quarantines_the_gpu_and_stops_its_units(host):
    daemon = load_daemon()
    health = daemon.Health(json.loads((host / "config.json").read_text()))
    kernel_says(host, "NVRM: Xid (PCI:0000:00:1e): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception "
                      "on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
    health.cycle()
    assert state(host)["quarantine"] == {} and state(host)["counts"] == {"0|Xid 13|application": 1}
    assert not (host / "systemctl.log").exists()
    kernel_says(host, "NVRM: Xid (PCI:0000:00:1f): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for "
                      "RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")
    health.cycle()
    held = state(host)["quarantine"]["1"]
    assert (held["class"], held["fault"], held["cause"]) == ("reset", "Xid 119", "Xid 119, reset (RESET_GPU)")
    assert (host / "systemctl.log").read_text() == "stop --no-block vllm@main.service\n"
    prom = (host / "gpu.prom").read_text()
    assert ('nvidia_gpu_quarantined{gpu="1",pci_bus_id="00000000:00:1F.0",class="reset",fault="Xid 119",'
            'cause="Xid 119, reset (RESET_GPU)"} 1') in prom
    assert 'nvidia_gpu_faults_total{gpu="0",fault="Xid 13",class="application"} 1' in prom
    # The unit's ExecCondition refuses to start on it; GPU 0 is fine.
    # (Its nvidia-smi reader, installed next to it on a host, is the collection's module_utils.)
    helper = ROOT / "roles" / "vllm" / "files" / "vllm-unit-helper"
    env = dict(os.environ, PYTHONPATH=str(MODULE_UTILS))
    refused = subprocess.run([sys.executable, str(helper), "gpus-healthy", "--state", str(host / "state" / "state.json"),
                              "--gpus", "1"], capture_output=True, text=True, check=False, env=env)
    assert refused.returncode == 1 and "GPU 1 is quarantined (needs a reset: Xid 119" in refused.stderr
    assert subprocess.run([sys.executable, str(helper), "gpus-healthy", "--state",
                           str(host / "state" / "state.json"), "--gpus", "0"], check=False, env=env).returncode == 0
    # A new agent (a restart) reads the log again from its start and does not count or act twice.
    again = daemon.Health(json.loads((host / "config.json").read_text()))
    again.cycle()
    assert state(host)["counts"] == {"0|Xid 13|application": 1, "1|Xid 119|reset": 1}
    # The runbook clears it after the reset; the old lines stay in the log and do not bring it back.
    subprocess.run([sys.executable, str(ROLE / "files" / "nvidia-gpu-health"), "--config", str(host / "config.json"),
                    "clear", "1", "--reason", "reset by the test"], check=True, env=dict(
                        os.environ, PYTHONPATH=str(MODULE_UTILS)))
    again.cycle()
    assert state(host)["quarantine"] == {}


def test_a_pending_row_remap_quarantines_for_a_reset_and_a_reset_clears_it(host):
    gpus = json.loads((host / "gpus.json").read_text())
    gpus["gpus"][0]["remapped_rows_pending"] = True
    (host / "gpus.json").write_text(json.dumps(gpus))
    health = load_daemon().Health(json.loads((host / "config.json").read_text()))
    health.cycle()
    held = state(host)["quarantine"]["0"]
    assert (held["class"], held["fault"]) == ("reset", "remapped rows")
    reset = subprocess.run([str(ROOT / "tests" / "fixtures" / "nvidia-smi"), "-r", "-i", "GPU-0"], capture_output=True,
                           text=True, check=False)
    assert (reset.returncode, reset.stdout) == (0, "GPU 00000000:00:1E.0 was successfully reset.\n")
    assert json.loads((host / "gpus.json").read_text())["gpus"][0]["remapped_rows_pending"] is False
