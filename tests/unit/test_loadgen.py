"""Unit tests for tools/loadgen.py, against a tiny HTTP server on 127.0.0.1 that fails some requests on purpose.

The server decides the failures and counts them itself, so the report's counts can be checked exactly.
"""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOADGEN = REPO / "tools" / "loadgen.py"

import loadgen  # noqa: E402


class FlakyServer(ThreadingHTTPServer):
    """Every 3rd non-streaming request gets a 500; every 4th stream is cut before [DONE]."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FlakyHandler)
        self.lock = threading.Lock()
        self.counts = {"plain": 0, "stream": 0, "plain_failed": 0, "stream_cut": 0, "auth": set()}


class FlakyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        streaming = bool(body.get("stream"))
        with srv.lock:
            srv.counts["auth"].add(self.headers.get("Authorization"))
            key = "stream" if streaming else "plain"
            srv.counts[key] += 1
            n = srv.counts[key]
            fail = (n % 4 == 0) if streaming else (n % 3 == 0)
            if fail:
                srv.counts["stream_cut" if streaming else "plain_failed"] += 1
        if not streaming:
            data = json.dumps({"error": "engine dead"} if fail else {"choices": [{"text": "hi"}]}).encode()
            self.send_response(500 if fail else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Served-By", "flaky")
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(3):
            self.wfile.write(f"data: {json.dumps({'choices': [{'text': str(i)}]})}\n\n".encode())
            self.wfile.flush()
        if not fail:
            self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@pytest.fixture()
def server():
    srv = FlakyServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}/v1/completions"


def test_counts_match_what_the_server_failed(server, tmp_path):
    report, events = tmp_path / "report.json", tmp_path / "events.jsonl"
    rc = loadgen.main([url(server), "--clients", "4", "--streaming-clients", "2", "--max-requests", "60",
                       "--duration", "30", "--api-key", "k-1", "--model", "m", "--report", str(report),
                       "--events", str(events)])
    assert rc == 0
    doc = json.loads(report.read_text())
    t, c = doc["totals"], server.counts
    assert doc["stop_reason"] == "max requests"
    assert t["sent"] == 60 == c["plain"] + c["stream"]
    assert t["sent_streaming"] == c["stream"] and t["sent_non_streaming"] == c["plain"]
    assert t["failed_non_streaming"] == c["plain_failed"] > 0
    assert t["failed_streaming"] == c["stream_cut"] > 0
    assert t["failed"] == t["failed_streaming"] + t["failed_non_streaming"]
    assert t["ok"] == t["sent"] - t["failed"]
    assert c["auth"] == {"Bearer k-1"}
    assert any(e.startswith("HTTP 500") for e in doc["errors"])
    assert any("before [DONE]" in e for e in doc["errors"])
    assert doc["served_by"]["flaky"] == c["plain"] - c["plain_failed"]
    assert sum(row["ok"] + row["failed"] for row in doc["per_second"]) == 60
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert len(lines) == 60
    assert {"client", "streaming", "start", "end", "ok"} <= set(lines[0])
    assert all(r["end"] >= r["start"] for r in lines)
    assert {r["client"] for r in lines if r["streaming"]} == {0, 1}


def test_failure_limits_set_the_exit_status(server, tmp_path):
    args = [url(server), "--clients", "1", "--streaming-clients", "0", "--max-requests", "6",
            "--report", str(tmp_path / "r.json")]
    assert loadgen.main(args + ["--max-failed-non-streaming", "0"]) == 1
    assert loadgen.main(args + ["--max-failed-non-streaming", "100"]) == 0


def test_connection_refused_is_a_failure_not_a_crash(tmp_path):
    free = ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler)
    port = free.server_address[1]
    free.server_close()  # nothing listens there now
    report = tmp_path / "r.json"
    assert loadgen.main([f"http://127.0.0.1:{port}/v1/completions", "--clients", "2", "--max-requests", "4",
                         "--report", str(report)]) == 0
    t = json.loads(report.read_text())["totals"]
    assert t["sent"] == 4 and t["failed"] == 4


@pytest.mark.parametrize("target", ["http://192.0.2.10:8000/v1/completions", "http://[2001:db8::1]/v1/completions",
                                    "http://10.1.2.3/v1/completions", "ftp://127.0.0.1/x"])
def test_non_loopback_targets_are_refused(target, capsys):
    assert loadgen.main([target, "--max-requests", "1"]) == 2
    assert "loadgen:" in capsys.readouterr().err
    with pytest.raises(loadgen.Refused):
        loadgen.check_target(target)


def test_loopback_targets_and_named_exceptions_are_accepted():
    for target in ("http://127.0.0.1:18080/v1/completions", "http://127.3.2.1/x", "http://[::1]:8000/x",
                   "http://localhost:8000/x"):
        assert loadgen.check_target(target).hostname
    # Only checked, never contacted: --allow-host lifts the rule for that host only.
    assert loadgen.check_target("http://192.0.2.10/x", ["192.0.2.10"]).hostname == "192.0.2.10"
    with pytest.raises(loadgen.Refused):
        loadgen.check_target("http://192.0.2.11/x", ["192.0.2.10"])


def test_arguments_are_bounded():
    for bad in (["--clients", "0"], ["--clients", "1000"], ["--duration", "0"], ["--duration", "1e9"],
                ["--max-requests", "0"], ["--clients", "2", "--streaming-clients", "3"], ["--extra-body", "[1]"]):
        with pytest.raises(SystemExit):
            loadgen.parse_args(["http://127.0.0.1/x", *bad])


def test_stop_file_and_sigterm_end_the_run(server, tmp_path):
    stop = tmp_path / "stop"
    for how in ("stop file", "SIGTERM"):
        report = tmp_path / f"{how}.json"
        proc = subprocess.Popen([sys.executable, str(LOADGEN), url(server), "--clients", "2", "--duration", "600",
                                 "--pause", "0.05", "--stop-file", str(stop), "--report", str(report)],
                                stderr=subprocess.PIPE, text=True)
        # Stop once it has sent something (on a loaded machine the interpreter alone can take over a second).
        before = server.counts["plain"] + server.counts["stream"]
        deadline = time.monotonic() + 30
        while server.counts["plain"] + server.counts["stream"] == before and time.monotonic() < deadline:
            time.sleep(0.1)
        if how == "stop file":
            stop.touch()
        else:
            proc.terminate()
        started = time.monotonic()
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
        assert time.monotonic() - started < 10
        doc = json.loads(report.read_text())
        assert doc["stop_reason"] == how
        assert doc["totals"]["sent"] > 0
        stop.unlink(missing_ok=True)
