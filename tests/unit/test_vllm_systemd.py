"""systemd's formats, one reader each (plugins/module_utils/vllm_systemd.py): `systemctl show` and the journal's
argv, shared by the modules and the host agents. The real journal is read on the test fleet (molecule/fleet: the
OOM counter, diagnose.yml, the readiness wait's startup report); here the argv and the cursor, and that the
startup read stops at its first lines."""
import subprocess

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_systemd import (
    journal_command, parse_show, show_command, split_cursor)
from ansible_collections.vllm_fleet.fleet.plugins.modules import vllm_ready


def test_show_reads_values_holding_equals_signs():
    assert show_command("vllm@main.service", ("MainPID", "ActiveState")) == [
        "systemctl", "show", "vllm@main.service", "-p", "MainPID,ActiveState"]
    assert parse_show("MainPID=12\nEnvironment=A=1 B=2\n\n") == {"MainPID": "12", "Environment": "A=1 B=2"}


def test_every_journal_read_is_one_argv_shape():
    assert journal_command("vllm@a.service", since="-24h") == [
        "journalctl", "--no-pager", "-o", "short-iso", "-u", "vllm@a.service", "--since", "-24h"]
    assert journal_command("vllm@a.service", lines=2000, output="cat") == [
        "journalctl", "--no-pager", "-o", "cat", "-u", "vllm@a.service", "-n", "2000"]
    assert journal_command(invocation="0f1e", output="cat") == [
        "journalctl", "--no-pager", "-o", "cat", "_SYSTEMD_INVOCATION_ID=0f1e"]
    # The OOM counter: after its cursor, or from this boot on its first run; the new cursor on the last line.
    assert journal_command("u", after_cursor="s=1;i=2", show_cursor=True)[-3:] == [
        "--after-cursor", "s=1;i=2", "--show-cursor"]
    assert journal_command("u", show_cursor=True)[-2:] == ["-b", "--show-cursor"]


def test_the_cursor_is_split_from_the_lines():
    assert split_cursor("a\nb\n-- cursor: s=1;i=2\n") == ("a\nb", "s=1;i=2")
    assert split_cursor("-- No entries --\n") == ("", None)
    assert split_cursor("") == ("", None)


def test_the_startup_read_passes_the_argv_whole_and_stops_at_its_count():
    argv = ["printf", "%s\\n", "one line", "two; $(not run)", "three", "four"]
    run = subprocess.run(["sh", "-c", vllm_ready.FIRST_LINES, "sh", "2", *argv], capture_output=True, text=True,
                         check=True)
    assert run.stdout == "one line\ntwo; $(not run)\n"
