"""plugins/action/roll_report.py: a host's record (the seconds between its steps, vLLM's own
start-to-ready, the overhead), the run's report assembled from the records, and the table the roll ends with. The
fleet scenario reads the same report after real rolls (test_2_fleet.py)."""
import json
import os
import stat

import pytest
from ansible_collections.vllm_fleet.fleet.plugins.action import roll_report



def events(host, **at):
    return [{"time": time, "host": host, "state": state} for state, time in at.items()]


def test_a_host_that_went_well_has_every_span_and_its_overhead():
    steps = events("gpu-a", start=100.0, draining=100.5, drained=105.25, stopped=113.0, ready=150.0, enabled=152.5)
    record = roll_report.host_record("gpu-a", "ok", "", steps, [31.9, 34.123], None)
    assert (record["drain_wait_s"], record["stop_s"], record["start_to_ready_s"], record["enable_s"]) == \
        (5.25, 7.75, 37.0, 2.5)
    # The slowest instance is the host's start-to-ready; the overhead is what the roll added around it.
    assert record["total_s"] == 52.5 and record["vllm_start_to_ready_s"] == 34.12 and record["overhead_s"] == 18.38
    assert record["events"] == steps and record["resumed"] is None


def test_a_host_that_failed_at_its_start_ends_at_its_failure_without_vllm_time():
    steps = events("gpu-b", start=10.0, draining=10.1, drained=12.0, stopped=20.0, failed=130.0)
    record = roll_report.host_record("gpu-b", "failed", "Start vLLM: refused", steps, [], {"step": "stopped"})
    assert record["start_to_ready_s"] is None and record["enable_s"] is None and record["total_s"] == 120.0
    assert record["vllm_start_to_ready_s"] is None and record["overhead_s"] is None
    assert record["error"] == "Start vLLM: refused" and record["resumed"] == {"step": "stopped"}


def test_a_step_recorded_twice_counts_at_its_last_time():
    steps = events("gpu-a", start=0.0, drained=5.0) + events("gpu-a", drained=7.0, enabled=9.0)
    assert roll_report.host_record("gpu-a", "ok", "", steps, [], None)["drain_wait_s"] == 7.0


def test_events_without_a_start_are_refused():
    with pytest.raises(ValueError, match="gpu-a: the events have no start"):
        roll_report.host_record("gpu-a", "ok", "", events("gpu-a", drained=1.0), [], None)


def test_the_report_is_every_record_with_events_in_time_order_and_the_table_reads_it(tmp_path):
    run = tmp_path / "20261206T220000Z"
    (run / "hosts").mkdir(parents=True)
    good = roll_report.host_record("gpu-b", "ok", "", events("gpu-b", start=1.0, drained=3.0, stopped=4.0,
                                                             ready=40.0, enabled=41.0), [30.0], None)
    bad = roll_report.host_record("gpu-a", "failed", "x", events("gpu-a", start=50.0, drained=52.0, failed=60.0),
                                  [], None)
    for record in (good, bad):
        roll_report.write(str(run / "hosts" / f"{record['host']}.json"), record)
    report = roll_report.assemble(str(run))
    assert report["run_id"] == "20261206T220000Z" and report["outcome"] == "failed"
    assert list(report["hosts"]) == ["gpu-a", "gpu-b"] and report["hosts"]["gpu-b"] == good
    times = [e["time"] for e in report["events"]]
    assert times == sorted(times) and len(times) == 8
    lines = roll_report.table(report)
    assert lines[0].split() == ["host", "outcome", "drain", "stop", "start->ready", "vLLM", "own", "enable", "total",
                                "overhead"]
    assert lines[1].split() == ["gpu-a", "failed", "2.0s", "-", "-", "-", "-", "10.0s", "-"]
    assert lines[2].split() == ["gpu-b", "ok", "2.0s", "1.0s", "36.0s", "30.0s", "1.0s", "40.0s", "10.0s"]
    assert lines[3] == "2 host(s), outcome failed, 59.0 s from the first host's start to the last step"


def test_each_instance_start_phases_follow_the_host_table(tmp_path):
    """The phases vllm_ready returned (weights, engine init, what was in it, the rest, the first completion) are kept
    per instance and shown after the run's line; a host without them (failed before ready) has no phase line."""
    run = tmp_path / "run"
    (run / "hosts").mkdir(parents=True)
    phases = {"weights_s": 14.43, "engine_init_s": 21.45, "profile_s": 17.96, "compile_s": None, "graphs_s": 3.0,
              "other_s": 24.12, "first_completion_s": 0.31}
    good = roll_report.host_record("gpu-b", "ok", "", events("gpu-b", start=1.0, drained=3.0, stopped=4.0, ready=64.0,
                                                             enabled=65.0), [60.0], None, None, {"main": phases})
    bad = roll_report.host_record("gpu-a", "failed", "x", events("gpu-a", start=1.0, failed=2.0), [], None)
    assert good["start_phases"] == {"main": phases} and bad["start_phases"] == {}
    for record in (good, bad):
        roll_report.write(str(run / "hosts" / f"{record['host']}.json"), record)
    lines = roll_report.table(roll_report.assemble(str(run)))
    assert lines[4].startswith("vLLM's start (seconds")
    assert lines[5].split() == ["instance", "weights", "engine", "init", "profile", "compile", "graphs", "other", "1st",
                                "reply"]
    assert lines[6].split() == ["gpu-b/main", "14.4s", "21.4s", "18.0s", "-", "3.0s", "24.1s", "0.3s"]
    assert len(lines) == 7


def test_an_empty_run_is_ok_with_no_host(tmp_path):
    (tmp_path / "hosts").mkdir()
    report = roll_report.assemble(str(tmp_path))
    assert report["outcome"] == "ok" and report["hosts"] == {} and report["events"] == []
    assert roll_report.table(report)[-1] == "0 host(s), outcome ok, 0.0 s from the first host's start to the last step"


def test_files_are_private_and_replaced_whole(tmp_path):
    path = tmp_path / "report.json"
    roll_report.write(str(path), {"a": 1})
    roll_report.write(str(path), {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(TypeError):
        roll_report.write(str(path), {"a": object()})
    assert json.loads(path.read_text()) == {"a": 2} and os.listdir(tmp_path) == ["report.json"]
