"""playbooks/rolling_restart.yml end to end on the controller, as benchmarks/bench_controller.py --roll times it at
1,000 hosts: the real playbook, lock, journal, batches, capacity guard and report; what touches a host or a
balancer is the benchmark's stand-in roles (a fleet where every host serves). Failure domains leave together, the
capacity guard counts each batch out, and the report has every host. The fleet scenario proves the host side."""
import json
import os
import re
import subprocess

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
import bench_controller  # noqa: E402  (a script folder, not a package)


def fleet():
    """The benchmark's fleet of 12 hosts, in three racks that cut across its GPU-type groups (so a rack is not a run
    of hosts in inventory order)."""
    inventory = bench_controller.inventory(12)
    for group in inventory["all"]["children"]["vllm"]["children"].values():
        for host, host_vars in group["hosts"].items():
            host_vars["rack"] = "rack-%d" % (int(host[-5:]) % 3)
    return inventory


def roll(tmp_path, *args):
    standins = bench_controller.standin_collection(str(tmp_path / "standins"))
    (tmp_path / "fleet.yml").write_text(yaml.safe_dump(fleet()))
    out = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(tmp_path / "fleet.yml"),
         "playbooks/rolling_restart.yml",
         "-e", json.dumps({"rolling_restart_lock_file": str(tmp_path / "roll.lock"),
                           "rolling_restart_journal_dir": str(tmp_path / "journal"),
                           "rolling_restart_reports_dir": str(tmp_path / "reports")}), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                 ANSIBLE_COLLECTIONS_PATH=standins))
    (run_id,) = os.listdir(tmp_path / "reports")
    with open(tmp_path / "reports" / run_id / "report.json", encoding="utf-8") as source:
        return out.returncode, out.stdout + out.stderr, json.load(source)


def racks():
    hosts = fleet()["all"]["children"]["vllm"]["children"]
    found = {}
    for group in hosts.values():
        for host, host_vars in group["hosts"].items():
            found.setdefault(host_vars["rack"], set()).add(host)
    return found


def batches(out):
    """The hosts of each batch of the roll's play, in order, from its play headers and the hosts' first task."""
    chunks = out.split("PLAY [Roll the vLLM fleet]")[1:]
    return [set(re.findall(r"ok: \[(gpu\d-\d+)\]", chunk.split("TASK [vllm_fleet.fleet.rolling_restart : Refuse a driver")[0]))
            for chunk in chunks]


def test_a_roll_by_failure_domain_takes_each_rack_out_together_and_reports_every_host(tmp_path):
    code, out, report = roll(tmp_path, "-e", "rolling_restart_batch_by=rack")
    assert code == 0, out[-3000:]
    expected = racks()
    assert len(expected) == 3
    assert sorted(map(sorted, batches(out))) == sorted(map(sorted, expected.values())), out[-3000:]
    assert report["outcome"] == "ok" and sorted(report["hosts"]) == sorted(set().union(*expected.values()))
    assert all(record["outcome"] == "ok" and [e["state"] for e in record["events"]]
               == ["start", "draining", "drained", "stopped", "ready", "enabled"] for record in report["hosts"].values())
    assert os.listdir(tmp_path / "journal") == []


def test_the_capacity_guard_counts_the_whole_batch_out_and_stops_the_roll_before_any_drain(tmp_path):
    # 12 hosts, racks of 4: 8 others stay UP while a rack leaves, so 9 must refuse the first rack.
    code, out, report = roll(tmp_path, "-e", "rolling_restart_batch_by=rack", "-e", "rolling_restart_min_healthy=9")
    assert code != 0
    text = " ".join(out.split())
    assert "Rolling restart stopped at" in text and "servers UP on other hosts per balancer {'balancer-1': 8}" in text
    (first,) = [hosts for hosts in racks().values() if hosts & set(report["hosts"])]
    assert set(report["hosts"]) == first and report["outcome"] == "failed"
    assert all([e["state"] for e in record["events"]] == ["start", "failed"] for record in report["hosts"].values())
    assert os.listdir(tmp_path / "journal") == []
