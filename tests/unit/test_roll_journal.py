"""plugins/action/roll_journal.py: the roll journal's writer. An entry is replaced whole (never
half written), 0600, unchanged when the record is the same; roll_lock's reader reads back what it wrote; forget
removes it. tests/playbooks/test_roll_lock_playbooks.py runs it through the role's event.yml."""
import os
import stat

import pytest
from ansible_collections.vllm_fleet.fleet.plugins.action import roll_journal, roll_lock
RECORD = {"host": "gpu-a", "step": "drained", "steps": ["start", "draining", "drained"], "since": 1765000000.5,
          "at": 1765000003.25, "playbook": "Roll the vLLM fleet", "run_dir": "/r",
          "options": {"apply_config": False, "apply_driver": False, "loadtest": False}, "error": ""}


def test_written_entry_is_read_back_by_the_lock_and_private(tmp_path):
    journal = tmp_path / "journal"
    assert roll_journal.write(roll_journal.entry(str(journal), "gpu-a"), RECORD) is True
    path = journal / "gpu-a.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(journal).st_mode) == 0o700
    assert roll_lock.read_journal(str(journal)) == [dict(RECORD, journal_file=str(path))]
    assert os.listdir(journal) == ["gpu-a.json"]  # no temporary file left


def test_same_record_is_no_change_a_new_step_replaces_it(tmp_path):
    roll_journal.write(roll_journal.entry(str(tmp_path), "gpu-a"), RECORD)
    assert roll_journal.write(roll_journal.entry(str(tmp_path), "gpu-a"), RECORD) is False
    stopped = dict(RECORD, step="stopped", steps=RECORD["steps"] + ["stopped"])
    assert roll_journal.write(roll_journal.entry(str(tmp_path), "gpu-a"), stopped) is True
    assert roll_lock.read_journal(str(tmp_path))[0]["step"] == "stopped"


def test_a_failed_write_keeps_the_old_entry_whole(tmp_path):
    roll_journal.write(roll_journal.entry(str(tmp_path), "gpu-a"), RECORD)
    with pytest.raises(TypeError):
        roll_journal.write(roll_journal.entry(str(tmp_path), "gpu-a"), dict(RECORD, step=object()))
    assert roll_lock.read_journal(str(tmp_path))[0]["step"] == "drained"
    assert os.listdir(tmp_path) == ["gpu-a.json"]


def test_forget_removes_the_entry_once(tmp_path):
    roll_journal.write(roll_journal.entry(str(tmp_path), "gpu-a"), RECORD)
    assert roll_journal.forget(roll_journal.entry(str(tmp_path), "gpu-a")) is True
    assert roll_journal.forget(roll_journal.entry(str(tmp_path), "gpu-a")) is False
    assert roll_lock.read_journal(str(tmp_path)) == []
