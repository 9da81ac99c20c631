"""Two balancers share a VIP (keepalived, group_vars/vip.yml); client-1 reaches them only through it.

Under load from client-1 (tools/loadgen.py, a new connection per request, each held 0.3 s by the stand-ins) the
balancer holding the VIP fails: its HAProxy is killed, then its host freezes; then both are rolled by
playbooks/roll_balancers.yml. Each time the VIP must move within seconds, and the client may lose only requests
that were open on the balancer that lost it (or sent to it while it was losing it). The figures are printed.
Traffic: from client-1 to the VIP, an address of the scenario's own network.
"""
import json
import os
import time

import pytest
from fleet import PROJECT, playbook, sh, wait_until

VIP = "198.18.231.250"
BALANCERS = ("balancer-1", "balancer-2")
CLIENT = "client-1"
STATE_FILE = "/run/keepalived/vllm-fleet.state"
FIGURES = []  # printed at the end of the run (conftest.py)


def holders():
    return [b for b in BALANCERS if sh(b, f"ip -o -4 addr show to {VIP}/32").stdout.strip()]


def vrrp_state(balancer):
    return sh(balancer, f"cat {STATE_FILE}", check=False).stdout.strip()


def other(balancer):
    return next(b for b in BALANCERS if b != balancer)


def settled():
    """The one holder, once the VIP is on exactly one balancer and the other stands by as BACKUP."""
    def check():
        held = holders()
        return held[0] if len(held) == 1 and vrrp_state(other(held[0])) == "BACKUP" else None
    return wait_until(check, 60, interval=0.5, what="one balancer holding the VIP and the other standing by")


def moved_to(balancer, timeout=30):
    """Wait on `balancer` itself until the VIP is on it; the time it got there (the hosts share the clock)."""
    out = sh(balancer, f"for i in $(seq {timeout * 20}); do ip -o -4 addr show to {VIP}/32 | grep -q . "
                       f"&& exec date +%s.%N; sleep 0.05; done; exit 1", check=False, timeout=timeout + 10)
    assert out.returncode == 0, f"the VIP did not reach {balancer} within {timeout} s"
    return float(out.stdout)


class VipLoad:
    """tools/loadgen.py on client-1 against the VIP for the span of a `with` block; .events: one dict per request."""

    def __init__(self, name, clients=8):
        self.base = f"/tmp/{name}"
        self.cmd = (f"nohup python3 /usr/local/bin/loadgen http://{VIP}/v1/completions --allow-host {VIP} "
                    f"--clients {clients} --streaming-clients 0 --max-tokens 4 --extra-body '{{\"standin_sleep\": 0.3}}' "
                    f"--timeout 15 --duration 600 --stop-file {self.base}.stop --report {self.base}.json "
                    f"--events {self.base}.jsonl > {self.base}.out 2>&1 &")
        self.events = []

    def __enter__(self):
        sh(CLIENT, f"rm -f {self.base}.*; {self.cmd}")
        time.sleep(3)  # traffic flowing before the failure
        return self

    def __exit__(self, *exc):
        time.sleep(3)  # and after it
        sh(CLIENT, f"touch {self.base}.stop")
        wait_until(lambda: sh(CLIENT, f"test -s {self.base}.json", check=False).returncode == 0, 60, interval=0.5,
                   what="the load generator's report")
        self.events = [json.loads(line) for line in sh(CLIENT, f"cat {self.base}.jsonl").stdout.splitlines()]
        return False

    def figures(self, what, windows):
        """Print the figures and check that every failed request was exposed to a move: in flight at some moment of
        a window [what made the VIP move, its arrival on the other balancer]. Returns the failed count."""
        def exposed(e):
            return any(e["start"] <= end and e["end"] >= start for start, end in windows)
        failed = [e for e in self.events if not e["ok"]]
        at_risk = [e for e in self.events if exposed(e)]
        moves = ", ".join(f"{end - start:.2f} s" for start, end in windows)
        print(f"\n{what}: VIP moved in {moves}; {len(self.events)} requests through the VIP, {len(failed)} failed, "
              f"out of {len(at_risk)} in flight while it moved; errors: {sorted({e['error'][:70] for e in failed})}")
        FIGURES.append(f"{what}: VIP moved in {moves}; {len(self.events)} requests through the VIP, {len(failed)} "
                       f"failed out of {len(at_risk)} in flight while it moved")
        stray = [e for e in failed if not exposed(e)]
        assert not stray, f"failures away from any VIP move: {stray[:3]}"
        assert len(self.events) > 20 * len(windows), "too little traffic to show anything"
        return len(failed)


def masters_since(since):
    """The times keepalived entered MASTER on any balancer since `since`: the VIP's arrivals."""
    times = []
    for balancer in BALANCERS:
        out = sh(balancer, f"journalctl -u keepalived -o short-unix --no-pager --since @{int(since)}", check=False)
        times += [float(line.split()[0]) for line in out.stdout.splitlines() if "Entering MASTER STATE" in line]
    return sorted(t for t in times if t >= since)


@pytest.fixture(scope="module", autouse=True)
def client():
    sh(CLIENT, "true")
    os.system(f"docker cp {os.path.join(PROJECT, 'tools', 'loadgen.py')} {CLIENT}:/usr/local/bin/loadgen >/dev/null")
    return CLIENT


def test_one_balancer_holds_the_vip_the_other_stands_by_and_the_client_is_served_through_it():
    holder = settled()
    assert vrrp_state(holder) == "MASTER"
    for balancer in BALANCERS:
        sh(balancer, "keepalived --config-test --use-file=/etc/keepalived/keepalived.conf")
        conf = sh(balancer, "cat /etc/keepalived/keepalived.conf").stdout
        assert "nopreempt" in conf and "check_unicast_src" in conf and f"{VIP}/32 dev eth0" in conf
        peer = sh(other(balancer), "ip -o -4 addr show dev eth0 scope global").stdout.split()[3].split("/")[0]
        assert f"unicast_peer {{\n        {peer}\n    }}" in conf, conf
        assert "BindsTo=haproxy.service" in sh(balancer, "systemctl cat keepalived").stdout
        assert sh(balancer, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1/balancer-health").stdout == "200"
    out = sh(CLIENT, f"curl -s -m 10 -d '{{\"prompt\": \"hi\"}}' http://{VIP}/v1/completions")
    assert "served by backend-" in out.stdout, out.stdout


def test_the_vip_moves_at_once_when_the_holders_haproxy_dies():
    """SIGKILL to HAProxy on the holder: keepalived, bound to it, stops and hands the VIP over; systemd restarts
    HAProxy, which starts keepalived again as a BACKUP that leaves the VIP where it is."""
    holder = settled()
    with VipLoad("vip-haproxy-killed") as load:
        killed = float(sh(holder, "date +%s.%N; systemctl kill --signal=SIGKILL haproxy").stdout.split()[0])
        arrived = moved_to(other(holder))
    assert arrived - killed < 3
    load.figures(f"HAProxy killed on {holder}", [(killed, arrived)])
    assert settled() == other(holder)  # back as a BACKUP, and not taking the VIP back


def test_the_vip_moves_within_seconds_when_the_holder_freezes():
    """docker pause of the holder (a host that hangs: no advert, no reset): the other takes the VIP after about
    3 adverts. Unfrozen, the old holder still thinks it is MASTER; VRRP keeps the higher priority's, which may move
    the VIP once more: counted in the same figures."""
    holder = settled()
    with VipLoad("vip-holder-frozen") as load:
        frozen = time.time()
        os.system(f"docker pause {holder} >/dev/null")
        try:
            arrived = moved_to(other(holder))
            time.sleep(2)
        finally:
            # The holder runs again during `docker unpause`, before it returns: its window opens with the call
            # (a request its return was late for once counted as a failure away from any move).
            resumed = time.time()
            os.system(f"docker unpause {holder} >/dev/null")
        back = settled()
        settled_at = time.time()
    assert arrived - frozen < 6
    windows = [(frozen, arrived)] + ([(resumed, settled_at)] if back == holder else [])
    load.figures(f"{holder} frozen" + (", then took the VIP back" if back == holder else ""), windows)


def test_the_balancers_roll_one_at_a_time_under_load_moving_the_vip_first():
    settled()
    with VipLoad("vip-roll") as load:
        started = time.time()
        proc = playbook("playbooks/roll_balancers.yml", timeout=600)
        ended = time.time()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "the VIP moving to" in proc.stdout
    # The holder steps aside first or second: the VIP moves once per holder, each move a stop of keepalived
    # (its last advert) then the other's MASTER a moment later.
    arrivals = masters_since(started)
    assert 1 <= len(arrivals) <= 2 and all(started < t < ended for t in arrivals), arrivals
    load.figures("roll of both balancers", [(t - 1.0, t) for t in arrivals])
    assert settled() in BALANCERS
    for balancer in BALANCERS:
        assert sh(balancer, "systemctl is-active haproxy keepalived").stdout.split() == ["active", "active"]


def test_the_roll_refuses_when_no_other_balancer_stands_by():
    holder = settled()
    standby = other(holder)
    sh(standby, "systemctl stop keepalived")
    try:
        proc = playbook("playbooks/roll_balancers.yml", "--limit", holder, timeout=300)
        assert proc.returncode != 0 and "no other balancer is ready to take the VIP" in proc.stdout, proc.stdout[-3000:]
        assert holders() == [holder]  # nothing was changed
    finally:
        sh(standby, "systemctl start keepalived")
    settled()
