"""The scheduled rolling restart on a real systemd controller host: the timer is armed, the service really runs
playbooks/rolling_restart.yml from the checkout and logs to the journal, and a run never overlaps another roll."""
from fleet import sh, unit_props, wait_until

HOST = "controller-1"
SERVICE = "vllm-fleet-roll.service"
LOCK = "/run/lock/vllm-fleet-roll.lock"
REPORTS = "/var/lib/vllm-fleet-roll/reports"


def cursor():
    """Where the journal ends now (a cursor: timestamps of one second mix adjacent runs)."""
    out = sh(HOST, "journalctl -n 1 --show-cursor --no-pager -o cat").stdout
    return out.strip().rpartition("-- cursor: ")[2]


def journal(after):
    return sh(HOST, f"journalctl -u {SERVICE} --after-cursor '{after}' --no-pager -o cat").stdout


def start_roll(timeout):
    """What the timer does when it fires; `systemctl start` of a oneshot returns when the run has ended."""
    started = sh(HOST, f"systemctl start {SERVICE}", check=False, timeout=timeout)
    assert started.returncode == 0, started.stderr + sh(HOST, f"journalctl -u {SERVICE} -n 40 --no-pager").stdout


def reports():
    return sh(HOST, f"ls {REPORTS} 2>/dev/null", check=False).stdout.split()


def test_timer_is_armed():
    assert sh(HOST, "systemctl is-enabled vllm-fleet-roll.timer").stdout.strip() == "enabled"
    timer = unit_props(HOST, "vllm-fleet-roll.timer", "ActiveState", "NextElapseUSecRealtime", "TimersCalendar")
    print(timer)
    assert timer["ActiveState"] == "active" and timer["NextElapseUSecRealtime"]
    assert "Sun *-*-* 03:00:00" in timer["TimersCalendar"]
    sh(HOST, f"systemd-analyze verify /etc/systemd/system/{SERVICE} /etc/systemd/system/vllm-fleet-roll.timer")


def test_a_scheduled_run_runs_the_roll_and_logs_to_the_journal():
    since, before = cursor(), reports()
    start_roll(timeout=300)
    p = unit_props(HOST, SERVICE, "Result", "ExecMainStatus", "ExecStart")
    log = journal(since)
    print(log[-1500:])
    assert p["Result"] == "success" and p["ExecMainStatus"] == "0", p
    assert "roll_schedule_note='scheduled at 100% by the timer'" in p["ExecStart"]  # quoted as one argument
    assert "PLAY [Roll the vLLM fleet]" in log and "PLAY RECAP" in log
    new = sorted(set(reports()) - set(before))
    assert len(new) == 1, (before, reports())  # the run's report directory, under the StateDirectory


def test_a_run_while_another_roll_holds_the_lock_skips():
    since, before = cursor(), reports()
    # A manual roll in progress: it holds the same lock (`flock <lock> ansible-playbook ...`).
    sh(HOST, f"systemd-run --unit=manual-roll flock {LOCK} sleep 300")
    try:
        wait_until(lambda: sh(HOST, f"flock -n {LOCK} true", check=False).returncode != 0, 20, 0.2,
                   "the manual roll to hold the lock")
        start_roll(timeout=120)
        p = unit_props(HOST, SERVICE, "Result", "ExecMainStatus")
        log = journal(since)
        print(p, log)
        assert p == {"Result": "success", "ExecMainStatus": "75"}
        assert "failed to get lock" in log and "PLAY" not in log
        assert reports() == before
    finally:
        sh(HOST, "systemctl stop manual-roll", check=False)


def test_the_watchdog_service_runs_its_playbook_under_the_same_lock():
    """vllm-fleet-watchdog.service (from the same template as the roll's) runs playbooks/watchdog.yml; nothing is
    wedged in this inventory, so it restarts nothing. While a roll holds the lock it skips, as the roll does."""
    service = "vllm-fleet-watchdog.service"
    assert sh(HOST, "systemctl is-enabled vllm-fleet-watchdog.timer", check=False).stdout.strip() == "disabled"
    sh(HOST, f"systemd-analyze verify /etc/systemd/system/{service} /etc/systemd/system/vllm-fleet-watchdog.timer")
    since = cursor()
    started = sh(HOST, f"systemctl start {service}", check=False, timeout=300)
    log = sh(HOST, f"journalctl -u {service} --after-cursor '{since}' --no-pager -o cat").stdout
    print(log[-1500:])
    # `systemctl start` of a oneshot returns 0 only if the run succeeded. Its unit's properties are no witness here:
    # with its timer stopped nothing references the unit, and systemd unloads it (ExecMainStatus 0) once it ends.
    assert started.returncode == 0, log[-3000:]
    assert "PLAY [Find the wedged vLLM instances]" in log and "PLAY RECAP" in log
    sh(HOST, f"systemd-run --unit=manual-roll-2 flock {LOCK} sleep 300")
    try:
        wait_until(lambda: sh(HOST, f"flock -n {LOCK} true", check=False).returncode != 0, 20, 0.2,
                   "the manual roll to hold the lock")
        since = cursor()
        sh(HOST, f"systemctl start {service}", timeout=120)  # exit 75 (skipped) counts as success
        log = sh(HOST, f"journalctl -u {service} --after-cursor '{since}' --no-pager -o cat").stdout
        assert "failed to get lock" in log and "PLAY" not in log, log
    finally:
        sh(HOST, "systemctl stop manual-roll-2", check=False)
