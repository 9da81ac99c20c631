"""playbooks/roll_lock.yml as the playbooks that change rotation import it, run for real on the controller: the
lock refuses a second run naming the holder; the roll journal is read and shown; a roll (or the watchdog) whose
--limit leaves out a host a cut-short roll left out of rotation is refused before anything else runs. The fleet
scenario proves the rest on real hosts (a killed roll resumed under load)."""
import json
import os
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")


def run(tmp_path, playbook, *args):
    inventory = tmp_path / "hosts.json"
    # gpu-b is never reached: every run below stops (or ends) before a task touches a host.
    inventory.write_text(json.dumps({"all": {"hosts": {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON}},
        "children": {"vllm": {"hosts": {"gpu-a": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON},
                                        "gpu-b": {"ansible_host": "192.0.2.255"}}}}}}))
    out = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inventory), f"playbooks/{playbook}",
         "-e", json.dumps({"rolling_restart_lock_file": str(tmp_path / "roll.lock"),
                           "rolling_restart_journal_dir": str(tmp_path / "journal"),
                           "rolling_restart_reports_dir": str(tmp_path / "reports")}), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")))
    return out.returncode, " ".join((out.stdout + out.stderr).split())


def left_out(tmp_path, host, step="stopped"):
    journal = tmp_path / "journal"
    journal.mkdir(exist_ok=True)
    (journal / f"{host}.json").write_text(json.dumps({
        "host": host, "step": step, "steps": ["start", "draining", "drained", step], "since": 1765000000.0,
        "at": 1765000030.0, "playbook": "Roll the vLLM fleet", "run_dir": "/x",
        "options": {"apply_config": True, "apply_driver": False, "loadtest": False}, "error": ""}))


def test_alone_it_shows_the_hosts_a_cut_short_roll_left_out(tmp_path):
    left_out(tmp_path, "gpu-b")
    code, out = run(tmp_path, "roll_lock.yml", "--limit", "localhost")
    assert code == 0, out[-3000:]
    assert "gpu-b was left out of rotation by" in out and "Roll the vLLM fleet" in out
    assert "(last step stopped, out since 2025-12-06T05:46:40Z)" in out
    assert "playbooks/rolling_restart.yml (with it in --limit) brings it back" in out


def test_a_roll_whose_limit_leaves_such_a_host_out_is_refused_before_anything_runs(tmp_path):
    left_out(tmp_path, "gpu-b")
    for playbook in ("rolling_restart.yml", "watchdog.yml"):
        code, out = run(tmp_path, playbook, "--limit", "gpu-a")
        assert code != 0, out[-3000:]
        assert "gpu-b: left out of rotation by an earlier roll" in out and "Nothing was changed" in out
        assert "Drain" not in out and "Find the wedged" not in out, out[-3000:]
        assert not (tmp_path / "reports").exists()


def test_a_second_run_is_refused_naming_the_holder(tmp_path):
    (tmp_path / "roll.lock").touch()
    holder = subprocess.Popen(["flock", str(tmp_path / "roll.lock"), "sleep", "120"])
    try:
        time.sleep(0.5)
        code, out = run(tmp_path, "drain_host.yml", "-e", "target=gpu-a")
        assert code != 0
        assert f"holds the roll lock {tmp_path / 'roll.lock'}" in out and "sleep 120" in out, out[-3000:]
        assert "Drain a vLLM host in every balancer" not in out
    finally:
        holder.kill()
        holder.wait()


def test_each_step_of_a_host_out_of_rotation_is_in_the_journal_until_it_is_back(tmp_path):
    """The role's event.yml, as the runbook calls it: nothing before the drain, the step at each step (numbers and
    booleans as such, for the next run), the entry gone once the host is enabled."""
    journal = tmp_path / "journal"
    steps = [{"ansible.builtin.include_role": {"name": "rolling_restart", "tasks_from": "event"},
              "vars": {"rolling_restart_state": state}} for state in ("draining", "stopped")]
    check = {"ansible.builtin.set_fact": {"seen": "{{ lookup('ansible.builtin.file', '%s/gpu-a.json') | from_json }}"
                                          % journal}}
    book = tmp_path / "steps.yml"
    book.write_text(json.dumps([{"hosts": "gpu-a", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"rolling_restart_events": [{"time": 1765000000.0, "host": "gpu-a",
                                                                  "state": "start"}]}},
        *steps, check,
        {"ansible.builtin.copy": {"content": "{{ seen | to_json }}", "dest": str(tmp_path / "seen.json"),
                                  "mode": "0600"}},
        {"ansible.builtin.include_role": {"name": "rolling_restart", "tasks_from": "event"},
         "vars": {"rolling_restart_state": "enabled"}}]}]))
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON},
        "gpu-a": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON}}}}))
    out = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inventory), str(book),
         "-e", json.dumps({"rolling_restart_journal_dir": str(journal), "rolling_restart_run_dir": "/r",
                           "rolling_restart_apply_config": "yes"})],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                 ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles")))
    assert out.returncode == 0, out.stdout[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["host"] == "gpu-a" and seen["step"] == "stopped" and seen["steps"] == ["start", "draining", "stopped"]
    assert isinstance(seen["since"], float) and seen["at"] >= seen["since"] > 1765000000.0
    assert seen["options"] == {"apply_config": True, "apply_driver": False, "loadtest": False}
    assert seen["run_dir"] == "/r" and seen["error"] == ""
    assert os.listdir(journal) == []


def test_failure_domains_a_host_does_not_name_stop_the_roll_before_anything_runs(tmp_path):
    code, out = run(tmp_path, "rolling_restart.yml", "-e", "rolling_restart_batch_by=rack")
    assert code != 0, out[-3000:]
    assert "rolling_restart_batch_by is rack, which host(s) gpu-a, gpu-b do not set" in out, out[-3000:]
    assert "Drain" not in out and not (tmp_path / "reports").exists()


def test_the_roll_ends_once_with_its_report_table_and_timeline(tmp_path):
    """The role's report.yml as the runbook's `always` calls it, on two hosts in batches of one: each host's record,
    and after the last batch only, report.json, the per-host table and timeline.png with the load's requests."""
    run_dir = tmp_path / "run"
    (run_dir / "hosts").mkdir(parents=True)
    load = tmp_path / "load.jsonl"
    load.write_text("".join(json.dumps({"start": 1765000000.0 + n, "end": 1765000000.5 + n, "ok": n != 3})
                            + "\n" for n in range(30)))
    book = tmp_path / "report.yml"
    book.write_text(json.dumps([{"hosts": "vllm", "gather_facts": False, "serial": 1, "tasks": [
        {"ansible.builtin.set_fact": {
            "rolling_restart_events": [{"time": 1765000000.0 + n, "host": "{{ inventory_hostname }}", "state": state}
                                       for n, state in enumerate(("start", "drained", "stopped", "ready"))],
            "rolling_restart_outcome": "ok", "rolling_restart_error": "",
            "vllm_ready_result": {"results": [
                {"item": {"name": "main"}, "start_to_ready": 0.5,
                 "phases": {"weights_s": 0.01, "engine_init_s": 0.3, "other_s": 0.19}},
                {"item": {"name": "second"}, "failed": True}]}}},
        {"ansible.builtin.include_role": {"name": "rolling_restart", "tasks_from": "report"}}]}]))
    inventory = tmp_path / "hosts.json"
    local = {"ansible_connection": "local", "ansible_python_interpreter": PYTHON}
    inventory.write_text(json.dumps({"all": {"children": {"vllm": {"hosts": {"gpu-a": local, "gpu-b": local}}}}}))
    out = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inventory), str(book),
         "-e", json.dumps({"rolling_restart_run_dir": str(run_dir), "rolling_restart_load_events": str(load)})],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                 ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles")))
    assert out.returncode == 0, out.stdout[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["outcome"] == "ok" and sorted(report["hosts"]) == ["gpu-a", "gpu-b"]
    assert report["hosts"]["gpu-b"]["vllm_start_to_ready_s"] == 0.5 and report["hosts"]["gpu-b"]["stop_s"] == 1.0
    # Each instance that started keeps its phases (the one that failed has none); the table shows them.
    assert report["hosts"]["gpu-b"]["start_phases"] == {"main": {"weights_s": 0.01, "engine_init_s": 0.3,
                                                                 "other_s": 0.19}}
    assert "gpu-a/main" in out.stdout and "gpu-b/main" in out.stdout, out.stdout[-3000:]
    # Once, after the last batch: one table, naming both hosts.
    assert out.stdout.count("host(s), outcome") == 1 and "2 host(s), outcome ok" in out.stdout, out.stdout[-3000:]
    # The same table beside the report (make demo prints it).
    table = (run_dir / "table.txt").read_text().splitlines()
    assert table[0].split()[:3] == ["host", "outcome", "drain"] and "2 host(s), outcome ok" in table[3]
    assert all(line.strip() in out.stdout for line in table if line.strip())
    png = (run_dir / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
