"""plugins/action/roll_lock.py: the roll lock is flock(2) held by a process that lives as long
as the run; a second run is refused naming the first; a run under flock(1) (the scheduled services) sees the lock as
its own; a run that ends, however it ends, releases it. Real processes and a real lock file."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.vllm_fleet.fleet.plugins.action import roll_lock

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "action" / "roll_lock.py"


def flock_free(path):
    return subprocess.run(["flock", "-n", str(path), "true"], check=False).returncode == 0


def wait_free(path, timeout=5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if flock_free(path):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def run():
    """A stand-in for an ansible-playbook process: the lock lives as long as it does."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_lock_is_held_while_the_run_lives_and_released_when_it_ends(tmp_path, run):
    path = tmp_path / "roll.lock"
    taken = roll_lock.take(str(path), run.pid, '"Roll the vLLM fleet" by alice')
    assert taken["held_by"] == "this run" and not taken["changed"]  # the fleet is unchanged
    assert not flock_free(path)
    # The same run again (a later play): already its own.
    assert roll_lock.take(str(path), run.pid, "x")["held_by"] == "this run"
    run.kill()
    run.wait()
    assert wait_free(path), "the holder outlived the run"


def test_another_run_is_refused_naming_the_holder_and_waits_with_a_timeout(tmp_path, run):
    path = tmp_path / "roll.lock"
    roll_lock.take(str(path), run.pid, '"Roll the vLLM fleet" by alice')
    with pytest.raises(AnsibleActionFail) as refused:
        roll_lock.take(str(path), os.getpid(), '"Drain a vLLM host" by bob')
    message = str(refused.value)
    assert "holds the roll lock" in message and "Nothing was changed" in message
    assert f"taken for ansible-playbook pid {run.pid}: \"Roll the vLLM fleet\" by alice" in message
    # With a timeout, the second run gets the lock once the first ends.
    threading.Timer(1, run.kill).start()
    mine = subprocess.Popen(["sleep", "60"])
    try:
        assert roll_lock.take(str(path), mine.pid, "bob", timeout=10)["held_by"] == "this run"
    finally:
        mine.kill()
        mine.wait()


def test_a_run_under_flock_sees_the_lock_as_its_own(tmp_path):
    """The scheduled services run `flock <lock> ansible-playbook ...`: the playbook's own lock must not refuse."""
    path = tmp_path / "roll.lock"
    script = ("import json, os, sys; sys.path.insert(0, %r); import importlib.machinery as m; "
              "mod = m.SourceFileLoader('roll_lock', %r).load_module(); "
              "print(json.dumps(mod.take(%r, os.getpid(), 'scheduled')))" % (str(ROOT), str(PLUGIN), str(path)))
    out = subprocess.run(["flock", "-n", str(path), sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["held_by"] == "this run's flock" and "flock" in result["msg"]
    # While flock(1) holds it for someone else, a run is refused naming that command.
    holder = subprocess.Popen(["flock", str(path), "sleep", "60"])
    try:
        time.sleep(0.5)
        with pytest.raises(AnsibleActionFail, match=r"pid \d+ \(flock .*sleep 60\)"):
            roll_lock.take(str(path), os.getpid(), "manual")
    finally:
        holder.kill()
        holder.wait()


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(AnsibleActionFail, match="rolling_restart_lock_file"):
        roll_lock.take(str(tmp_path / "no" / "roll.lock"), os.getpid(), "x")


def test_the_journal_is_read_whole_or_refused_naming_the_file(tmp_path):
    assert roll_lock.read_journal(str(tmp_path / "none")) == []
    (tmp_path / "vllm-2.json").write_text(json.dumps({"host": "vllm-2", "step": "drained"}))
    (tmp_path / "notes.txt").write_text("ignored")
    assert roll_lock.read_journal(str(tmp_path)) == [
        {"host": "vllm-2", "step": "drained", "journal_file": str(tmp_path / "vllm-2.json")}]
    (tmp_path / "vllm-3.json").write_text('{"host": "vllm-3", "step": ')
    with pytest.raises(AnsibleActionFail, match="vllm-3.json cannot be read"):
        roll_lock.read_journal(str(tmp_path))
    (tmp_path / "vllm-3.json").write_text('{"step": "stopped"}')
    with pytest.raises(AnsibleActionFail, match="vllm-3.json names no host"):
        roll_lock.read_journal(str(tmp_path))
