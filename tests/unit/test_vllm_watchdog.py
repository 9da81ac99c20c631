"""The watchdog's wedge judgement (roles/vllm/files/vllm-watchdog), fed /metrics as the real CPU build printed it
(tests/fixtures/vllm-metrics: idle, busy twice 2 s apart, and wedged twice 10 s apart after SIGSTOP on EngineCore),
and its HAProxy agent answering over a real TCP socket on loopback."""
import os
import socket
import threading

import pytest
from conftest import load_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
METRICS = os.path.join(ROOT, "tests", "fixtures", "vllm-metrics")
# On a host the module_utils sit next to the program; here they are the collection's own files (pytest.ini).
watchdog = load_file(os.path.join(ROOT, "roles", "vllm", "files", "vllm-watchdog"), "vllm_watchdog")
parse_metrics = watchdog.parse_metrics

STALL, PROBE_TIMEOUT, PROBE_INTERVAL = 60, 30, 60
T0 = 1_796_397_600.0  # 2026-12-04 15:20:00 UTC


def metrics(name):
    with open(os.path.join(METRICS, name + ".txt"), encoding="utf-8") as handle:
        return parse_metrics(handle.read())


def judge():
    return watchdog.Judge(STALL, PROBE_TIMEOUT, PROBE_INTERVAL)


def test_every_fixture_names_its_source_and_holds_the_counters_the_judgement_reads():
    for name in ("idle", "busy-1", "busy-2", "wedged-1", "wedged-2"):
        with open(os.path.join(METRICS, name + ".txt"), encoding="utf-8") as handle:
            assert handle.readline().startswith("# source: "), name
        found = metrics(name)
        # The names the judgement reads exist on the real build: a renamed counter would make it blind.
        assert set(watchdog.PROGRESS + watchdog.ACTIVE) <= set(found), name


def test_the_parser_sums_label_sets_and_skips_nan_and_comments():
    text = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        'vllm:num_requests_running{engine="0",model_name="a}b"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} NaN',
        "vllm:generation_tokens_total 7.0 1796397600000",
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 4.0',
    ])
    assert parse_metrics(text) == {"vllm:num_requests_running": 3.0, "vllm:generation_tokens_total": 7.0}
    busy = metrics("busy-1")
    assert busy["vllm:num_requests_running"] == 2 and busy["vllm:generation_tokens_total"] == 1996


def test_busy_and_progressing_is_never_wedged_however_long_between_looks():
    j = judge()
    assert j.observe(T0, "4242", True, metrics("busy-1")) is None
    # Far beyond the stall threshold, but the counters moved: busy, not wedged, and no probe of a busy server.
    assert j.observe(T0 + 10 * STALL, "4242", True, metrics("busy-2")) is None
    assert j.verdict == "up" and j.agent_reply() == "up\n"


def test_requests_held_and_no_counter_moving_for_the_stall_is_wedged_with_the_evidence():
    j = judge()
    j.observe(T0, "4242", True, metrics("busy-2"))
    j.observe(T0 + STALL - 1, "4242", True, metrics("busy-2"))
    assert j.verdict == "up"
    j.observe(T0 + STALL, "4242", True, metrics("busy-2"))
    assert j.verdict == "down"
    assert j.evidence == ("running 2, waiting 0; prompt_tokens 341, generation_tokens 3317, iterations 1804 "
                          "unchanged for 60s (since 15:20:00Z)")
    assert j.events == ["WEDGED (MainPID 4242): " + j.evidence]
    reply = j.agent_reply()
    assert reply.startswith("down #wedged: running 2") and reply.endswith("\n") and reply.count("\n") == 1


def test_a_wedge_that_shows_no_request_is_caught_by_the_probe():
    """After SIGSTOP on EngineCore, /metrics read 0 running and 0 waiting while two requests hung."""
    j = judge()
    j.observe(T0, "4242", True, metrics("wedged-1"))
    assert j.observe(T0 + PROBE_INTERVAL - 1, "4242", True, metrics("wedged-2")) is None
    assert j.observe(T0 + PROBE_INTERVAL, "4242", True, metrics("wedged-2")) == "probe"
    j.probed(T0 + PROBE_INTERVAL + PROBE_TIMEOUT, True, PROBE_TIMEOUT, None, metrics("wedged-2"))
    assert j.verdict == "down"
    assert "a one-token completion got no answer in 30s" in j.evidence
    assert "generation_tokens 5001" in j.evidence and "since 15:20:00Z" in j.evidence
    # Out of rotation no client request reaches it: it is probed again, and an answer's tokens bring it back.
    later = T0 + 2 * PROBE_INTERVAL + PROBE_TIMEOUT
    assert j.observe(later, "4242", True, metrics("wedged-2")) == "probe"
    j.probed(later + 1, False, 0.3, 200, None)
    j.observe(later + 2, "4242", True, metrics("wedged-2") | {"vllm:generation_tokens_total": 5002.0})
    assert j.verdict == "up" and j.events[-1].startswith("progressing again")


def test_a_probe_answered_or_outrun_by_progress_is_not_a_wedge():
    j = judge()
    j.observe(T0, "4242", True, metrics("idle"))
    assert j.observe(T0 + PROBE_INTERVAL, "4242", True, metrics("idle")) == "probe"
    j.probed(T0 + PROBE_INTERVAL + 1, False, 0.2, 200, None)
    assert j.verdict == "up" and j.events == []
    # Probed at most once per probe interval.
    assert j.observe(T0 + PROBE_INTERVAL + 2, "4242", True, metrics("idle")) is None
    # No answer in time, but the engine did work meanwhile (a burst arrived): busy, not wedged.
    assert j.observe(T0 + 3 * PROBE_INTERVAL, "4242", True, metrics("idle")) == "probe"
    j.probed(T0 + 3 * PROBE_INTERVAL + PROBE_TIMEOUT, True, PROBE_TIMEOUT, None, metrics("busy-1"))
    assert j.verdict == "up"
    # An error status is an answer (an engine death is systemd's business), but a wrong key or name is said.
    j.probed(T0 + 5 * PROBE_INTERVAL, False, 0.1, 401, None)
    assert j.verdict == "up" and "probe answered HTTP 401" in j.events[-1]


def test_metrics_unanswered_while_requests_were_held_is_wedged_and_while_idle_is_not():
    j = judge()
    j.observe(T0, "4242", True, metrics("busy-1"))
    j.observe(T0 + STALL - 1, "4242", True, None)
    assert j.verdict == "up"
    j.observe(T0 + STALL, "4242", True, None)
    assert j.verdict == "down" and j.evidence.startswith("/metrics unanswered for 60s while 2 requests")
    idle = judge()
    idle.observe(T0, "4242", True, metrics("idle"))
    idle.observe(T0 + 10 * STALL, "4242", True, None)
    assert idle.verdict == "up"  # an API server that does not answer fails HAProxy's /health check by itself


def test_a_new_main_pid_starts_afresh_and_progress_clears_the_verdict():
    j = judge()
    j.observe(T0, "4242", True, metrics("busy-2"))
    j.observe(T0 + STALL, "4242", True, metrics("busy-2"))
    assert j.verdict == "down"
    # The restart: stopping (not active), then a new process. Nothing carries over.
    j.observe(T0 + STALL + 5, "0", False, None)
    assert j.verdict == "up"
    j.observe(T0 + STALL + 60, "5151", True, metrics("wedged-1"))
    assert j.verdict == "up" and j.pid == "5151" and "new MainPID 5151" in j.events[-1]
    # Wedged again, then the engine moves on by itself (SIGCONT): up again, and said.
    j.observe(T0 + 3 * STALL, "5151", True, metrics("busy-1") | {"vllm:generation_tokens_total": 5001.0,
                                                                     "vllm:prompt_tokens_total": 501.0,
                                                                     "vllm:iteration_tokens_total_count": 2849.0})
    j.observe(T0 + 4 * STALL, "5151", True, metrics("wedged-1") | {"vllm:num_requests_running": 2.0})
    assert j.verdict == "down"
    j.observe(T0 + 4 * STALL + 5, "5151", True, metrics("busy-2") | {"vllm:generation_tokens_total": 9999.0})
    assert j.verdict == "up" and j.events[-1].startswith("progressing again (MainPID 5151)")


def test_a_release_without_the_counters_is_not_judged():
    j = judge()
    held = {"vllm:num_requests_running": 3.0}
    j.observe(T0, "4242", True, held)
    assert j.observe(T0 + 10 * STALL, "4242", True, held) is None and j.verdict == "up"
    assert "no progress counter in /metrics" in j.events[0]


def test_the_agent_answers_haproxy_over_tcp():
    config = {"instances": [{"name": "main", "port": 8000, "gpus": [0]}], "stall_seconds": STALL,
              "probe_timeout": PROBE_TIMEOUT, "probe_interval": PROBE_INTERVAL, "agent_address": "127.0.0.1",
              "agent_port": 0}
    dog = watchdog.Watchdog(config)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        config["agent_port"] = probe.getsockname()[1]
    threading.Thread(target=watchdog.serve, args=(dog,), daemon=True).start()

    def ask(line):
        for _ in range(50):
            try:
                with socket.create_connection(("127.0.0.1", config["agent_port"]), timeout=5) as conn:
                    conn.sendall(line)  # what HAProxy sends: agent-send "main\n"
                    return conn.makefile().read()
            except ConnectionRefusedError:
                threading.Event().wait(0.1)
        raise AssertionError("the agent did not listen")

    assert ask(b"main\n") == "up\n"
    judge_ = dog.judges["main"]
    judge_.observe(T0, "4242", True, metrics("busy-2"))
    judge_.observe(T0 + STALL, "4242", True, metrics("busy-2"))
    assert ask(b"main\n").startswith("down #wedged: running 2, waiting 0; prompt_tokens 341")
    # An instance this host does not run: no state word, HAProxy changes nothing.
    assert ask(b"other\n") == "#not watched here\n"
    assert dog.state()["main"]["verdict"] == "down"


@pytest.mark.parametrize("evidence", ["line\nbreak", "x" * 500, "caf\u00e9"])
def test_the_agent_reply_stays_one_short_ascii_line(evidence):
    j = judge()
    j.verdict, j.evidence = "down", evidence
    reply = j.agent_reply()
    assert reply.count("\n") == 1 and reply.endswith("\n") and len(reply) <= 207 and reply.isascii()


def wedged_dog(textfile):
    """A watchdog of two instances, "main" wedged at T0 + STALL (busy-2 held, no counter moving), "side" up."""
    config = {"instances": [{"name": "main", "port": 8000}, {"name": "side", "port": 8001}], "stall_seconds": STALL,
              "probe_timeout": PROBE_TIMEOUT, "probe_interval": PROBE_INTERVAL, "textfile": textfile}
    dog = watchdog.Watchdog(config)
    dog.judges["main"].observe(T0, "4242", True, metrics("busy-2"))
    dog.judges["main"].observe(T0 + STALL, "4242", True, metrics("busy-2"))
    dog.judges["side"].observe(T0, "5151", True, metrics("busy-1"))
    return dog


def test_the_verdicts_go_to_node_exporters_textfile_whole(tmp_path):
    """What the VllmEngineWedged alert reads: 1 or 0 per unit (the name node exporter's systemd collector uses, so
    the monitoring role relabels it to the same `instance`), and since when for the wedged ones."""
    path = tmp_path / "vllm-watchdog.prom"
    dog = wedged_dog(str(path))
    logged = []
    dog.log = lambda name, line: logged.append((name, line))
    dog.write_textfile(dog.state())
    assert path.read_text() == (
        "# HELP vllm_fleet_watchdog_wedged 1 while vllm-watchdog judges the instance wedged (HAProxy agent: down).\n"
        "# TYPE vllm_fleet_watchdog_wedged gauge\n"
        'vllm_fleet_watchdog_wedged{name="vllm@main.service"} 1\n'
        'vllm_fleet_watchdog_wedged{name="vllm@side.service"} 0\n'
        "# HELP vllm_fleet_watchdog_wedged_since_seconds When vllm-watchdog judged the instance wedged (Unix time); "
        "only while wedged.\n"
        "# TYPE vllm_fleet_watchdog_wedged_since_seconds gauge\n"
        'vllm_fleet_watchdog_wedged_since_seconds{name="vllm@main.service"} %d\n' % (T0 + STALL))
    # Written through a temp file renamed over it (node exporter never reads half a file), none left behind.
    assert [p.name for p in tmp_path.iterdir()] == ["vllm-watchdog.prom"] and logged == []
    # The engine moves again: 0, and no since.
    dog.judges["main"].observe(T0 + STALL + 5, "4242", True, metrics("busy-2") | {"vllm:generation_tokens_total": 1e4})
    dog.write_textfile(dog.state())
    assert 'vllm_fleet_watchdog_wedged{name="vllm@main.service"} 0\n' in path.read_text()
    assert "vllm_fleet_watchdog_wedged_since_seconds{" not in path.read_text()


def test_no_textfile_directory_is_said_once_and_never_stops_the_watchdog(tmp_path):
    """Without node exporter's directory (a host without host_exporters, a directory removed) the watchdog goes on
    judging and answering HAProxy; it says so once, and once again when the file can be written."""
    directory = tmp_path / "node-exporter"
    dog = wedged_dog(str(directory / "vllm-watchdog.prom"))
    logged = []
    dog.log = lambda name, line: logged.append((name, line))
    dog.write_textfile(dog.state())
    dog.write_textfile(dog.state())
    assert len(logged) == 1 and logged[0][0] == "textfile" and "FileNotFoundError" in logged[0][1]
    assert dog.reply("main").startswith("down #wedged: ")
    directory.mkdir()
    dog.write_textfile(dog.state())
    assert logged[1:] == [("textfile", "written again: %s" % (directory / "vllm-watchdog.prom"))]
    assert 'vllm_fleet_watchdog_wedged{name="vllm@main.service"} 1\n' in (directory / "vllm-watchdog.prom").read_text()


def test_no_textfile_configured_writes_nothing(tmp_path):
    dog = wedged_dog("")
    dog.write_textfile(dog.state())
    assert not list(tmp_path.iterdir())


# --- The valve: the concurrency the balancers hold an instance to (HAProxy maxconn through the agent) -------------

VALVE = {"enabled": True, "factor": 0.5, "cooldown": 10, "calm": 60, "step": 0.25, "preemptions": 1, "kv_full": 0.95}


def pressure(preemptions=0.0, usage=0.2, waiting=0.0):
    return {"vllm:num_preemptions_total": preemptions, "vllm:kv_cache_usage_perc": usage,
            "vllm:num_requests_waiting": waiting}


def test_the_valve_halves_under_pressure_and_comes_back_step_by_step_to_the_plan():
    valve = watchdog.Valve(VALVE)
    valve.start(8, T0)
    valve.observe(T0 + 1, pressure(), 0)
    assert valve.maxconn() == 8 and valve.events == []
    valve.observe(T0 + 2, pressure(preemptions=3), 0)  # preemptions rose: halved at once
    assert valve.maxconn() == 4 and "limit 8 -> 4: 3 preemptions" in valve.events[-1]
    valve.observe(T0 + 5, pressure(preemptions=5), 0)  # within the cooldown: not again
    assert valve.maxconn() == 4
    valve.observe(T0 + 15, pressure(preemptions=5, usage=0.97, waiting=2), 0)  # KV full with a queue
    assert valve.maxconn() == 2 and "KV cache 97% full with 2 waiting" in valve.events[-1]
    valve.observe(T0 + 30, pressure(preemptions=5), 1)  # vllm-oom-counter counted one
    assert valve.maxconn() == 1 and "1 runtime OOM" in valve.events[-1]
    valve.observe(T0 + 45, pressure(preemptions=9), 1)
    assert valve.maxconn() == 1  # never below 1
    valve.observe(T0 + 100, pressure(preemptions=9), 1)  # calm for 55 s: not yet
    assert valve.maxconn() == 1
    steps = []
    for minute in range(2, 8):
        valve.observe(T0 + 45 + 60 * minute, pressure(preemptions=9), 1)
        steps.append(valve.maxconn())
    assert steps == [3, 5, 7, 8, 8, 8]  # +2 (a quarter of the plan) a calm minute, never above the plan
    assert "calm for" in valve.events[-1]


def test_a_restart_starts_again_from_the_plan_and_the_operator_caps_it():
    valve = watchdog.Valve(VALVE)
    valve.start(8, T0)
    valve.observe(T0 + 1, pressure(), 0)
    valve.observe(T0 + 2, pressure(preemptions=2), 0)
    assert valve.maxconn() == 4
    valve.start(8, T0 + 3)  # a new MainPID
    assert valve.maxconn() == 8 and "back to the plan's 8" in valve.events[-1]
    valve.manual = 3
    assert valve.maxconn() == 3
    valve.start(None, T0 + 4)  # no plan file: no limit of its own, the operator's still holds
    assert valve.maxconn() == 3
    valve.manual = None
    assert valve.maxconn() is None


def test_the_agent_says_maxconn_in_every_reply_before_the_description():
    judge_ = judge()
    assert judge_.agent_reply(4) == "up maxconn:4\n" and judge_.agent_reply() == "up\n"
    judge_.verdict, judge_.evidence = "down", "no progress"
    assert judge_.agent_reply(4) == "down maxconn:4 #wedged: no progress\n"


def test_the_valve_reads_the_plan_the_oom_counter_and_the_operators_limits(tmp_path):
    plan = tmp_path / "main.plan.json"
    plan.write_text('{"concurrency_limit": 6, "engine_args": {}}')
    assert watchdog.plan_limit(str(plan)) == 6 and watchdog.plan_limit(str(tmp_path / "none.json")) is None
    # vllm-oom-counter's textfile, as its render writes it (tests/unit/test_vllm_oom_counter.py).
    text = ('# TYPE vllm_fleet_runtime_oom_total counter\nvllm_fleet_runtime_oom_total{name="vllm@main.service"} 2\n'
            'vllm_fleet_runtime_oom_total{name="vllm@side.service"} 0\n')
    assert watchdog.runtime_ooms(text, "main") == 2 and watchdog.runtime_ooms(text, "other") is None
    limits = tmp_path / "limits.json"
    limits.write_text('{"main": 2, "side": "x", "other": 0}')
    assert watchdog.manual_limits(str(limits)) == {"main": 2}
    assert watchdog.manual_limits(str(tmp_path / "absent.json")) == {}
