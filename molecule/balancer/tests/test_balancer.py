"""The balancer role on real HAProxy (Debian 12's 2.6) in front of two stand-in backends.

Traffic goes only to 127.0.0.1:18080 (published from balancer-1:80) and to the scenario's own containers.
The tests run in file order: each leaves every server UP for the next one, unless it says otherwise.
"""
import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from fleet import PROJECT, playbook, sh, wait_until

LB = "balancer-1"
URL = "http://127.0.0.1:18080/v1/completions"
SOCKET = "/run/haproxy/admin.sock"
STATE_FILE = "/var/lib/haproxy/server-state"
PLAYBOOKS = "playbooks"
B1, B2 = "backend-1-main", "backend-2-main"


def lb(cmd):
    return sh(LB, f"echo '{cmd}' | socat -t 5 - UNIX-CONNECT:{SOCKET}").stdout


def servers():
    """{server: show stat row} of the vllm backend, with 'admin' (ready/drain/maint) from show servers state."""
    rows = csv.DictReader(lb("show stat").lstrip("# ").splitlines())
    out = {r["svname"]: r for r in rows if r["pxname"] == "vllm" and r["svname"] not in ("FRONTEND", "BACKEND")}
    for line in lb("show servers state vllm").splitlines()[1:]:
        words = line.split()
        if len(words) > 6 and words[3] in out:
            flags = int(words[6])
            out[words[3]]["admin"] = "maint" if flags & 0x23 else "drain" if flags & 0x18 else "ready"
    return out


def status(name):
    return servers()[name]["status"]


def complete(extra=None, timeout=60):
    """(HTTP status, X-Served-By) of one completion through the balancer."""
    body = json.dumps({"model": "standin", "prompt": "hi", "max_tokens": 4, **(extra or {})}).encode()
    req = urllib.request.Request(URL, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            json.loads(resp.read())
            return resp.status, resp.headers.get("X-Served-By", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("X-Served-By", "")


def served_by(n=20):
    answers = [complete() for _ in range(n)]
    assert {code for code, _ in answers} == {200}, answers
    return {who for _, who in answers}


def run(name, target, *extra, timeout=300):
    started = time.monotonic()
    proc = playbook(f"{PLAYBOOKS}/{name}_host.yml" if name != "status" else f"{PLAYBOOKS}/balancer_status.yml", "-e", f"target={target}", *extra, timeout=timeout)
    return proc, time.monotonic() - started


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-4000:]


def standin(host, action, port=8000):
    sh(host, f"systemctl {action} standin-vllm@{port}")


def wait_status(name, wanted, timeout=30):
    return wait_until(lambda: status(name) == wanted, timeout, interval=0.2, what=f"{name} {wanted}")


class Background:
    """Long completions sent from threads, to hold sessions open on the backends."""

    def __init__(self, count, sleep):
        self.results = []
        self.threads = [threading.Thread(target=lambda: self.results.append(complete({"standin_sleep": sleep})))
                        for _ in range(count)]
        for t in self.threads:
            t.start()

    def join(self):
        for t in self.threads:
            t.join(120)
        return self.results


@pytest.fixture(autouse=True)
def every_server_up_before(request):
    if request.node.get_closest_marker("continues"):
        return  # this test starts where the previous one ended
    for name in (B1, B2):
        wait_status(name, "UP", timeout=30)


def test_configuration_valid_service_enabled_reload_saves_state_first():
    sh(LB, "haproxy -c -q -f /etc/haproxy/haproxy.cfg")
    cfg = sh(LB, "cat /etc/haproxy/haproxy.cfg").stdout
    assert f"server {B1} backend-1:8000 check" in cfg and f"server {B2} backend-2:8000 check" in cfg
    for line in ("option httpchk GET /health", "http-check expect status 200", "inter 1s fall 2 rise 2",
                 "retry-on conn-failure empty-response response-timeout 500 502 503 504", "option redispatch 1",
                 "option http-buffer-request", "retries 3", "balance leastconn", "timeout server 10m",
                 f"server-state-file {STATE_FILE}", "load-server-state-from-file global"):
        assert line in cfg, line
    assert sh(LB, "systemctl is-enabled haproxy").stdout.strip() == "enabled"
    reload = sh(LB, "systemctl show haproxy -p ExecReload").stdout
    steps = [part.split(" ;")[0] for part in reload.split("argv[]=")[1:]]
    assert steps[0].startswith("/usr/sbin/haproxy -Ws -f $CONFIG -c")  # check, then save, then USR2
    assert steps[1].startswith("/usr/local/libexec/vllm-fleet-balancer/haproxy-server-state save")
    assert steps[2].startswith("/bin/kill -USR2")


def test_admin_socket_is_root_only_and_stats_page_on_loopback():
    assert sh(LB, f"stat -c '%a %U' {SOCKET}").stdout.strip() == "600 root"
    listening = sh(LB, "ss -Hltn").stdout
    assert "127.0.0.1:8404" in listening and "0.0.0.0:8404" not in listening
    assert "vllm" in sh(LB, "curl -s http://127.0.0.1:8404/ | head -c 100000").stdout
    assert sh("backend-1", "curl -s -m 3 -o /dev/null http://balancer-1:8404/", check=False).returncode != 0


def test_prometheus_exporter_reports_every_server_on_its_own_bind():
    """balancer_prometheus_bind (":8405" in the test inventory): HAProxy's built-in exporter, scraped by the
    monitoring role, from another host of the network; the client port does not serve it."""
    metrics = sh("backend-1", "curl -sf -m 5 http://balancer-1:8405/metrics").stdout
    status = [line for line in metrics.splitlines() if line.startswith("haproxy_server_status{")]
    for server in (B1, B2):
        assert f'proxy="vllm",server="{server}",state="UP"}} 1' in "\n".join(status), status
    assert "haproxy_server_status" not in sh(LB, "curl -s -m 5 http://127.0.0.1:80/metrics").stdout


def test_traffic_reaches_both_backends():
    assert served_by(20) == {"backend-1:8000", "backend-2:8000"}


def test_dead_backend_is_detected_down_and_requests_still_succeed(tmp_path):
    report, stop = tmp_path / "load.json", tmp_path / "stop"
    load = subprocess.Popen([sys.executable, os.path.join(PROJECT, "tools", "loadgen.py"), URL, "--clients", "4",
                             "--streaming-clients", "2", "--duration", "90", "--pause", "0.02", "--model", "standin",
                             "--stop-file", str(stop), "--report", str(report), "--timeout", "30"],
                            stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        stopped = time.monotonic()
        standin("backend-1", "stop")
        wait_status(B1, "DOWN", timeout=15)
        detected = time.monotonic() - stopped
        time.sleep(3)
        standin("backend-1", "start")
        wait_status(B1, "UP", timeout=30)
        time.sleep(2)
    finally:
        stop.touch()
        assert load.wait(timeout=60) == 0, load.stderr.read()
    totals = json.loads(report.read_text())["totals"]
    print(f"DOWN detected after {detected:.1f} s; load: {totals}")
    assert detected < 5  # inter 1s x fall 2, plus the check in flight
    assert totals["sent"] > 50
    assert totals["failed_non_streaming"] == 0  # retried on the other server
    assert totals["failed_streaming"] <= 2  # only a stream already under way on the dying server may be cut


def test_status_gives_every_server_and_the_other_up_count(tmp_path):
    out = tmp_path / "status.json"
    proc, _ = run("status", "backend-1", "-e", f"status_out={out}")
    ok(proc)
    doc = json.loads(out.read_text())
    entries = {s["name"]: s for s in doc["balancer_status"][LB]}
    assert set(entries) == {B1, B2}
    assert all(s["state"] == "UP" and s["admin"] == "ready" for s in entries.values())
    assert {"scur", "qcur", "status", "check_status"} <= set(entries[B1])
    assert doc["balancer_status_other_up"] == {LB: 1, "balancer-2": 1} and doc["balancer_status_other_up_min"] == 1
    # Two balancers sharing a VIP (group_vars/vip.yml): one holds it.
    assert len(doc["balancer_vip_holders"]) == 1 and "VIP 198.18.231.250 on balancer-" in proc.stdout


def test_drain_waits_for_sessions_then_maint_while_traffic_goes_elsewhere():
    long = Background(4, sleep=8)
    wait_until(lambda: int(servers()[B1]["scur"]) > 0, 10, interval=0.1, what="a session on backend-1")
    result = {}
    drain = threading.Thread(target=lambda: result.update(zip(("proc", "elapsed"), run("drain", "backend-1"))))
    drain.start()
    wait_until(lambda: servers()[B1]["admin"] != "ready", 30, interval=0.2, what="backend-1 out of service")
    during = served_by(10)
    drain.join(120)
    ok(result["proc"])
    assert during == {"backend-2:8000"}
    assert [code for code, _ in long.join()] == [200] * 4  # nothing cut
    row = servers()[B1]
    assert row["status"] == "MAINT" and row["scur"] == "0"
    assert result["elapsed"] > 3, "drain.yml returned before the sessions ended"
    print(f"drain.yml took {result['elapsed']:.1f} s")


@pytest.mark.continues
def test_reload_and_restart_keep_maint_and_reload_cuts_nothing():
    long = Background(2, sleep=4)
    time.sleep(0.5)
    sh(LB, "systemctl reload haproxy")
    assert status(B1) == "MAINT"
    assert [code for code, _ in long.join()] == [200, 200]  # in flight across the reload
    saved = [line.split() for line in sh(LB, f"cat {STATE_FILE}").stdout.splitlines() if f" {B1} " in line]
    assert saved and int(saved[0][6]) & 1  # FMAINT in the state file
    sh(LB, "systemctl restart haproxy")
    wait_until(lambda: sh(LB, f"test -S {SOCKET}", check=False).returncode == 0, 10, what="admin socket")
    time.sleep(1)
    assert status(B1) == "MAINT"
    assert served_by(10) == {"backend-2:8000"}


@pytest.mark.continues
def test_enable_brings_it_back_up():
    assert status(B1) == "MAINT"
    proc, elapsed = run("enable", "backend-1")
    ok(proc)
    assert status(B1) == "UP"  # enable.yml returned only once every balancer said UP
    assert served_by(20) == {"backend-1:8000", "backend-2:8000"}
    print(f"enable.yml took {elapsed:.1f} s")



def test_drain_of_a_down_backend_does_not_hang():
    # community.general#8092: a DOWN server in drain never shows the status text "DRAIN".
    standin("backend-2", "stop")
    try:
        wait_status(B2, "DOWN", timeout=15)
        proc, elapsed = run("drain", "backend-2", "-e", "balancer_drain_timeout=60")
        ok(proc)
        assert status(B2) == "MAINT" and elapsed < 30
    finally:
        standin("backend-2", "start")
    ok(run("enable", "backend-2")[0])


def test_enable_fails_with_the_state_seen_when_the_backend_stays_down():
    standin("backend-2", "stop")
    try:
        wait_status(B2, "DOWN", timeout=15)
        proc, elapsed = run("enable", "backend-2", "-e", "balancer_enable_timeout=3")
        assert proc.returncode != 0
        assert f"vllm/{B2}=DOWN" in proc.stdout and elapsed < 60
    finally:
        standin("backend-2", "start")
    ok(run("enable", "backend-2")[0])


def test_drain_timeout_fails_leaving_drain_which_a_reload_keeps():
    # Sessions of 30 s: the drain (timeout 2 s) must find them open, however late its playbook starts on busy cores
    # (10 s sessions had ended before a run beside the driver scenario reached its wait).
    long = Background(4, sleep=30)
    wait_until(lambda: int(servers()[B1]["scur"]) > 0, 10, interval=0.1, what="a session on backend-1")
    proc, _ = run("drain", "backend-1", "-e", "balancer_drain_timeout=2")
    assert proc.returncode != 0 and f"vllm/{B1}=DRAIN" in proc.stdout and "scur" in proc.stdout
    assert servers()[B1]["admin"] == "drain"
    sh(LB, "systemctl reload haproxy")
    assert servers()[B1]["admin"] == "drain"
    assert [code for code, _ in long.join()] == [200] * 4
    ok(run("enable", "backend-1")[0])


def test_a_new_instance_joins_in_maint_until_enabled():
    """A host (here: a second instance of backend-2, port 8001) added to a running balancer with
    balancer_new_servers_state=maint gets no traffic until enable.yml; removing it again leaves the rest UP."""
    new = "backend-2-extra"
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as extra:
        extra.write("all:\n  children:\n    vllm:\n      hosts:\n        backend-2:\n          vllm_instances:\n"
                    "            - {name: main, port: 8000, gpus: [0]}\n"
                    "            - {name: extra, port: 8001, gpus: [0]}\n")
    try:
        proc = playbook("molecule/balancer/converge.yml", "-i", extra.name, "-e", "balancer_new_servers_state=maint")
        ok(proc)
        rows = servers()
        assert rows[new]["status"] == "MAINT" and rows[new]["addr"] == f"{rows[new]['addr'].split(':')[0]}:8001"
        assert rows[B1]["status"] == "UP" and rows[B2]["status"] == "UP"
        assert "backend-2:8001" not in served_by(20)
        sh(LB, "systemctl reload haproxy")  # the state file must not resurrect it as ready
        assert status(new) == "MAINT"
        proc, _ = run("enable", "backend-2", "-i", extra.name)
        ok(proc)
        assert status(new) == "UP"
        wait_until(lambda: "backend-2:8001" in served_by(10), 20, interval=0.5, what="traffic on the new instance")
    finally:
        os.unlink(extra.name)
    ok(playbook("molecule/balancer/converge.yml"))  # back to the scenario's inventory: the instance goes away
    rows = servers()
    assert set(rows) == {B1, B2} and {r["status"] for r in rows.values()} == {"UP"}


def test_a_balancer_that_does_not_answer_stops_a_drain_before_any_change(tmp_path):
    """A second balancer that cannot be reached (no such container): drain_host.yml refuses, naming it, and
    balancer-1 keeps sending traffic to backend-1."""
    extra = tmp_path / "lost-balancer.yml"
    extra.write_text("all:\n  children:\n    balancer:\n      hosts:\n        balancer-gone:\n"
                     "          ansible_connection: community.docker.docker\n")
    proc, _ = run("drain", "backend-1", "-i", str(extra))
    assert proc.returncode != 0
    assert "Balancer(s) balancer-gone did not answer" in proc.stdout, proc.stdout[-3000:]
    assert "Nothing was changed for backend-1" in proc.stdout
    assert servers()[B1]["admin"] == "ready" and status(B1) == "UP"
    assert "backend-1" in " ".join(served_by(20))


# --- The live lever: each server held to its plan, the rest queued, 503 beyond the queue (issue 25) ---------------

LIMITS = {B1: 2, B2: 3}  # the plans' concurrency_limit (converge.yml)


def peak(backend, reset=False):
    """The stand-in's completions in progress, the most at once and the count since the last reset."""
    out = sh(backend, "curl -s http://127.0.0.1:8000/peak" + ("?reset" if reset else "")).stdout
    return json.loads(out)


def backend_stats():
    """The vllm backend's own `show stat` row (qcur: requests waiting for a slot, hrsp_5xx)."""
    return next(r for r in csv.DictReader(lb("show stat").lstrip("# ").splitlines())
                if r["pxname"] == "vllm" and r["svname"] == "BACKEND")


def timed(extra, timeout=60):
    """(HTTP status, seconds, Retry-After, body) of one completion through the balancer."""
    body = json.dumps({"model": "standin", "prompt": "hi", "max_tokens": 4, **extra}).encode()
    req = urllib.request.Request(URL, data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, time.monotonic() - started, None, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic() - started, exc.headers.get("Retry-After"), exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return None, time.monotonic() - started, None, str(exc)


def at_once(count, extra):
    results, threads = [], [threading.Thread(target=lambda: results.append(timed(extra))) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def test_each_server_is_held_to_its_plan_and_the_rest_waits_in_the_queue():
    cfg = sh(LB, "cat /etc/haproxy/haproxy.cfg").stdout
    for server, limit in LIMITS.items():
        line = next(line for line in cfg.splitlines() if line.strip().startswith("server %s " % server))
        assert " maxconn %d" % limit in line, line
    assert all(servers()[s]["slim"] == str(limit) for s, limit in LIMITS.items())
    for backend in ("backend-1", "backend-2"):
        peak(backend, reset=True)
    threads, results = at_once(12, {"standin_sleep": 2})
    queued = wait_until(lambda: int(backend_stats()["qcur"] or 0), 10, interval=0.2, what="requests queued")
    for thread in threads:
        thread.join(60)
    seen = {backend: peak(backend) for backend in ("backend-1", "backend-2")}
    # 5 slots for 12 requests of 2 s: nobody waited past the queue's timeout, no server held more than its plan.
    assert [r[0] for r in results] == [200] * 12, results
    assert seen["backend-1"]["peak"] <= 2 and seen["backend-2"]["peak"] <= 3, seen
    assert queued >= 1 and seen["backend-1"]["requests"] + seen["backend-2"]["requests"] == 12
    print("12 requests of 2 s on 2 + 3 slots: %d queued at once, peaks %d and %d, slowest %.1f s"
          % (queued, seen["backend-1"]["peak"], seen["backend-2"]["peak"], max(r[1] for r in results)))


def test_beyond_the_queue_timeout_requests_get_503_with_retry_after_at_once():
    threads, results = at_once(8, {"standin_sleep": 13})  # 5 run for 13 s, 3 wait longer than timeout queue (10 s)
    for thread in threads:
        thread.join(60)
    served = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    assert len(served) == 5 and len(refused) == 3, results
    for status_, seconds, retry_after, body in refused:
        assert retry_after == "5" and 9 < seconds < 12.5, (seconds, retry_after)
        assert json.loads(body)["error"]["message"].startswith("the vLLM fleet is at capacity or restarting")
    assert int(backend_stats()["hrsp_5xx"]) >= 3
    print("8 requests of 13 s on 5 slots: 5 served, 3 answered 503 after %.1f-%.1f s (Retry-After 5)"
          % (min(r[1] for r in refused), max(r[1] for r in refused)))


def test_a_queued_request_is_retried_elsewhere_when_its_server_goes_down():
    """Requests running on backend-1 and queued for a slot when its server dies: the running ones are retried on
    backend-2 (retry-on, buffered body), the queued ones wait for backend-2's slots: none is lost. observe layer4
    marks backend-1 DOWN at its first refused connection, else leastconn sends the retries back to it (fewest
    sessions) and they end in 503 (seen on HAProxy 2.6 without it)."""
    threads, results = at_once(9, {"standin_sleep": 2})
    time.sleep(0.5)
    standin("backend-1", "stop")
    try:
        for thread in threads:
            thread.join(60)
        assert status(B1) == "DOWN"
    finally:
        standin("backend-1", "start")
    codes = [r[0] for r in results]
    print("9 requests, 5 running and 4 queued when backend-1 stopped: %d served, failed: %s"
          % (codes.count(200), [c for c in codes if c != 200]))
    assert codes == [200] * 9, results
    wait_status(B1, "UP")


def test_the_door_refuses_more_max_tokens_and_larger_bodies_than_the_fleet_takes():
    before = sum(peak(b)["requests"] for b in ("backend-1", "backend-2"))
    code, _, _, body = timed({"max_tokens": 5000})
    assert code == 400 and "max_tokens above the limit of this fleet (4096)" in body
    code, _, _, body = timed({"prompt": "x" * 70000})
    assert code == 400 and "request body above the limit of this fleet (65536 bytes)" in body
    assert sum(peak(b)["requests"] for b in ("backend-1", "backend-2")) == before  # no server saw them
    assert timed({"max_tokens": 4096})[0] == 200


def test_the_agent_sets_maxconn_and_it_stays_until_the_agent_says_another():
    """What vllm-watchdog's valve relies on: "maxconn:N" in an agent answer sets the server's maxconn on HAProxy
    2.6, an answer without it leaves it, and a later one replaces it (a manual `set maxconn` too)."""
    def slim():
        return servers()[B2]["slim"]
    try:
        for answer, expected in (("up maxconn:1", "1"), ("up", "1"), ("up maxconn:3", "3")):
            sh("backend-2", "echo %s > /run/standin-agent-reply" % shlex.quote(answer))
            wait_until(lambda: slim() == expected, 10, interval=0.2, what="maxconn %s after %r" % (expected, answer))
        lb("set maxconn server vllm/%s 1" % B2)
        wait_until(lambda: slim() == "3", 10, interval=0.2, what="the agent's maxconn back")
    finally:
        sh("backend-2", "rm -f /run/standin-agent-reply")


def test_the_manual_lever_round_trips_and_status_shows_limits_and_queue(tmp_path):
    """playbooks/server_limit.yml on a host without a watchdog: the ceiling in its limits file and in every
    balancer at once; a share of the plan; back to the plan; a value that is not one refused naming the host."""
    limits = "/var/lib/vllm-fleet/server-limits.json"
    for value, expected, written in (("1", "1", {"main": 1}), ("50%", "1", {"main": 1}), ("plan", "2", {})):
        ok(playbook("playbooks/server_limit.yml", "-e", "target=backend-1", "-e", "maxconn=" + value))
        assert servers()[B1]["slim"] == expected, value
        assert json.loads(sh("backend-1", "cat " + limits).stdout) == written
    proc = playbook("playbooks/server_limit.yml", "-e", "target=backend-1", "-e", "maxconn=0")
    assert proc.returncode != 0 and "backend-1: maxconn must be a number from 1" in proc.stdout
    out = tmp_path / "status.json"
    proc, _ = run("status", "backend-1", "-e", "status_out=%s" % out)
    ok(proc)
    result = json.loads(out.read_text())
    rows = {s["name"]: s for s in result["balancer_status"][LB]}
    assert rows[B1]["slim"] == 2 and rows[B2]["slim"] == 3
    assert result["balancer_queues"][LB][0]["backend"] == "vllm" and result["balancer_queues"][LB][0]["hrsp_5xx"] >= 3
    assert "waiting for a slot" in proc.stdout and "backend-1-main UP 0/2" in proc.stdout
