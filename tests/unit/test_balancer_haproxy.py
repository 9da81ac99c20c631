"""The balancer role's HAProxy helpers without HAProxy: the server-state merge and the admin-socket module.

State lines and `show stat` columns are as HAProxy 2.6 (Debian 12) prints them; the module talks to a fake admin
socket that keeps per-server state like HAProxy does (admin flags apart from health, scur, DRAIN of a DOWN server).
"""
import json
import os
import socket
import socketserver
import sys
import threading
from pathlib import Path

import pytest
from conftest import load_file

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "balancer"


state_helper = load_file(ROLE / "files" / "haproxy-server-state", "haproxy_server_state")
from ansible_collections.vllm_fleet.fleet.plugins.modules import haproxy_servers as servers_module  # noqa: E402

HEADER = ("# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
          "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
          "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port "
          "srv_check_addr srv_agent_addr srv_agent_port")
SAVED = "\n".join([
    "1", HEADER,
    "3 vllm 1 gpu-01-main 10.0.0.1 2 8 1 1 826 15 3 3 6 0 0 0 - 8000 - 0 0 - - 0",   # DRAIN
    "3 vllm 2 gpu-02-main 10.0.0.2 0 1 1 1 826 15 3 0 14 0 0 0 - 8000 - 0 0 - - 0",  # MAINT
    "3 vllm 3 gpu-03-main 10.0.0.3 2 0 1 1 829 15 3 3 6 0 0 0 - 8000 - 0 0 - - 0",   # READY, port changes below
    "3 vllm 4 gpu-04-main 172.18.0.4 2 1 1 1 5 15 3 3 6 0 0 0 gpu-04 8000 - 0 0 - - 0",  # by name, MAINT
    "3 vllm 5 gone-main 10.0.0.9 2 0 1 1 5 15 3 3 6 0 0 0 - 8000 - 0 0 - - 0",     # removed from the config
    "",
])
CONFIG = """\
global
    stats socket /run/haproxy/admin.sock mode 600 level admin
defaults
    mode http
    default-server inter 2s
backend vllm  # a comment
    balance leastconn
    default-server inter 1s fall 2 rise 2
    server gpu-01-main 10.0.0.1:8000 check
    server gpu-02-main 10.0.0.2:8000 check
    server gpu-03-main 10.0.0.3:8001 check
    server gpu-04-main gpu-04:8000 check weight 10
    server gpu-05-main 10.0.0.5:8000 check
listen stats
    bind 127.0.0.1:8404
backend fresh
    server new-a 10.0.0.7:8000 check
"""


@pytest.fixture()
def config(tmp_path):
    path = tmp_path / "haproxy.cfg"
    path.write_text(CONFIG)
    return str(path)


def merged(config, policy):
    lines = state_helper.merge(state_helper.parse_servers_state(SAVED), state_helper.parse_config(config), policy)
    rows = state_helper.parse_servers_state("\n".join(lines))
    return lines, {r["srv_name"]: r for r in rows}


def test_config_parsing(config):
    servers = state_helper.parse_config(config)
    assert servers[("vllm", "gpu-04-main")] == {"addr": "gpu-04", "port": "8000", "weight": "10", "check": True}
    assert servers[("vllm", "gpu-03-main")]["port"] == "8001"
    assert ("fresh", "new-a") in servers and len(servers) == 6
    assert state_helper.split_address("[::1]:8000") == ("::1", "8000")
    assert state_helper.split_address("ipv4@10.0.0.1:80") == ("10.0.0.1", "80")
    assert state_helper.split_address("fe80::1:8000") == ("fe80::1", "8000")


def test_saved_states_are_kept_for_unchanged_servers(config):
    lines, rows = merged(config, "ready")
    assert lines[0] == "1" and lines[1].startswith("# be_id")
    assert rows["gpu-01-main"]["srv_admin_state"] == "8"  # DRAIN survives
    assert rows["gpu-02-main"]["srv_admin_state"] == "1"  # MAINT survives
    assert rows["gpu-04-main"]["srv_admin_state"] == "1"  # matched by its name (srv_fqdn)
    assert "gone-main" not in rows


def test_a_moved_server_does_not_get_its_old_port_back(config):
    # HAProxy would apply the saved port 8000 over the configuration's 8001 (src/server_state.c).
    _, rows = merged(config, "ready")
    assert rows["gpu-03-main"]["srv_port"] == "8001"
    assert rows["gpu-03-main"]["srv_op_state"] == "0"  # DOWN until its checks pass at the new place


@pytest.mark.parametrize("policy,admin", [("ready", "0"), ("maint", "1")])
def test_new_servers_follow_the_policy(config, policy, admin):
    _, rows = merged(config, policy)
    new = rows["gpu-05-main"]
    assert (new["srv_op_state"], new["srv_admin_state"], new["srv_port"]) == ("0", admin, "8000")
    assert new["srv_check_status"] == "1"  # "initializing": a 0 here leaves HAProxy's checks stuck
    assert new["srv_check_state"] == "6"
    assert rows["gpu-03-main"]["srv_admin_state"] == admin  # moved = new
    assert "new-a" not in rows  # a backend never seen before starts on HAProxy's defaults


def test_prepare_without_a_file_does_nothing_and_save_without_socket_keeps_the_file(config, tmp_path):
    state = tmp_path / "server-state"
    common = ["--config", config, "--state-file", str(state), "--socket", str(tmp_path / "none.sock")]
    assert state_helper.main(["prepare", *common]) == 0 and not state.exists()
    state.write_text(SAVED)
    assert state_helper.main(["save", *common]) == 1
    assert state.read_text() == SAVED
    assert state_helper.main(["prepare", *common, "--new-servers", "maint"]) == 0
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    assert "gpu-05-main - 0 1 " in state.read_text()


# --- the module, against a fake admin socket ----------------------------------------------------------------------

STAT_COLUMNS = "pxname,svname,qcur,scur,status,check_status,addr"


class FakeHAProxy(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path):
        # name -> op (0 stopped / 2 running), admin flags, scur
        self.servers = {"a-main": [2, 0, 0], "b-main": [2, 0, 3], "c-main": [0, 0, 0]}
        self.commands = []
        super().__init__(path, FakeHandler)

    def status(self, name):
        op, admin, _ = self.servers[name]
        if admin & 0x23:
            return "MAINT"
        if op == 0:
            return "DOWN"  # what HAProxy shows for a DOWN server in drain too (community.general#8092)
        return "DRAIN" if admin & 0x18 else "UP"


class FakeHandler(socketserver.StreamRequestHandler):
    def handle(self):
        cmd = self.rfile.readline().decode().strip()
        srv = self.server
        srv.commands.append(cmd)
        if cmd == "show stat":
            rows = [f"vllm,{n},0,{s[2]},{srv.status(n)},L7OK,10.0.0.1:8000" for n, s in srv.servers.items()]
            out = "# " + STAT_COLUMNS + "\nvllm,FRONTEND,,0,OPEN,,\n" + "\n".join(rows) + "\nvllm,BACKEND,0,0,UP,,\n\n"
        elif cmd == "show servers state":
            out = "1\n" + HEADER + "\n" + "".join(
                f"3 vllm {i} {n} 10.0.0.1 {s[0]} {s[1]} 1 1 0 15 3 3 6 0 0 0 - 8000 - 0 0 - - 0\n"
                for i, (n, s) in enumerate(srv.servers.items())) + "\n"
        elif cmd.startswith("set server vllm/"):
            name, state = cmd.split("/", 1)[1].split(" state ")
            if name not in srv.servers:
                out = "No such server.\n\n"
            else:
                srv.servers[name][1] = {"ready": 0, "drain": 8, "maint": 1}[state]
                out = "\n"
        else:
            out = "Unknown command.\n"
        self.wfile.write(out.encode())


@pytest.fixture()
def fake(tmp_path):
    path = str(tmp_path / "admin.sock")
    srv = FakeHAProxy(path)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def run_module(args, capsys):
    from ansible.module_utils.testing import patch_module_args

    with patch_module_args(args), pytest.raises(SystemExit):
        servers_module.main()
    return json.loads(capsys.readouterr().out)


def test_snapshot_reads_admin_flags_not_the_status_text(fake):
    fake.servers["c-main"][1] = 8  # DOWN and draining: HAProxy's status says only DOWN
    by_name = {s["name"]: s for s in servers_module.snapshot(fake.server_address)}
    assert by_name["c-main"]["status"] == "DOWN" and by_name["c-main"]["state"] == "DRAIN"
    assert by_name["c-main"]["admin"] == "drain"
    assert by_name["b-main"]["scur"] == 3 and by_name["a-main"]["state"] == "UP"


def test_drain_sets_drain_then_waits_for_sessions(fake, capsys):
    base = {"socket": fake.server_address, "backend": "vllm", "servers": ["b-main", "c-main"], "state": "drain"}
    out = run_module({**base, "timeout": 1, "interval": 0.1}, capsys)
    assert out["failed"] and out["timed_out"]
    assert "b-main=DRAIN (admin drain, scur 3" in out["msg"] and "c-main" not in out["msg"]
    assert fake.servers["b-main"][1] == 8 and fake.servers["c-main"][1] == 8  # the DOWN one too
    fake.servers["b-main"][2] = 0
    out = run_module(base, capsys)
    assert not out.get("failed") and not out["changed"]  # already in DRAIN, and no session left
    out = run_module({**base, "state": "maint"}, capsys)
    assert out["changed"] and {s["state"] for s in out["servers"]} == {"MAINT"}
    out = run_module(base, capsys)  # drain of a MAINT server: stays MAINT
    assert not out["changed"] and fake.servers["b-main"][1] == 1


def test_drain_timeout_can_continue(fake, capsys):
    out = run_module({"socket": fake.server_address, "servers": ["b-main"], "state": "drain", "timeout": 1,
                      "interval": 0.2, "on_timeout": "continue"}, capsys)
    assert not out.get("failed") and out["timed_out"] and out["changed"]


def test_ready_waits_for_up_and_reports_what_it_saw(fake, capsys):
    fake.servers["a-main"][1] = 1
    fake.servers["c-main"][1] = 1
    out = run_module({"socket": fake.server_address, "servers": ["a-main", "c-main"], "state": "ready",
                      "timeout": 1, "interval": 0.2}, capsys)
    assert out["failed"] and out["changed_servers"] == ["a-main", "c-main"]
    assert "c-main=DOWN" in out["msg"] and "a-main" not in out["msg"]  # a-main is UP
    fake.servers["c-main"][0] = 2
    out = run_module({"socket": fake.server_address, "servers": ["c-main"], "state": "ready"}, capsys)
    assert not out.get("failed") and not out["changed"]


def test_unknown_server_fails_and_check_mode_changes_nothing(fake, capsys):
    out = run_module({"socket": fake.server_address, "servers": ["nope"], "state": "maint"}, capsys)
    assert out["failed"] and "nope" in out["msg"] and "vllm/a-main" in out["msg"]
    out = run_module({"socket": fake.server_address, "servers": ["a-main"], "state": "maint",
                      "_ansible_check_mode": True}, capsys)
    assert out["changed"] and fake.servers["a-main"][1] == 0
    assert not any(c.startswith("set server") for c in fake.commands)


def test_save_state_runs_after_a_change(fake, capsys, tmp_path):
    marker = tmp_path / "saved"
    out = run_module({"socket": fake.server_address, "servers": ["a-main"], "state": "maint",
                      "save_state": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]}, capsys)
    assert out["changed"] and marker.exists()


def test_missing_socket_is_a_clear_failure(tmp_path, capsys):
    out = run_module({"socket": str(tmp_path / "no.sock")}, capsys)
    assert out["failed"] and "admin socket" in out["msg"]


def test_socket_timeout_is_bounded(tmp_path):
    path = str(tmp_path / "silent.sock")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(path)
    silent.listen(1)
    try:
        with pytest.raises(servers_module.AdminSocketError):
            servers_module.command(path, "show stat", timeout=0.5)
    finally:
        silent.close()
        os.unlink(path)
