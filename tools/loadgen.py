#!/usr/bin/env python3
"""Continuous completion traffic against an OpenAI-compatible endpoint (vLLM, or HAProxy in front of it).

N client threads, the first M of them streaming ("stream": true), each sending one request after the other until
the duration is over, the request budget is spent, the stop file appears, or SIGTERM/SIGINT arrives (requests in
flight then finish, within --timeout). Every request is recorded (start, end, client, streaming, outcome, HTTP
status or error text, X-Served-By if the server sends it) in an optional JSONL file as it ends, and summed up in a
JSON report: sent, ok, failed, and failures of streaming and non-streaming requests counted apart (a stream already
under way on a dying backend cannot be retried by any balancer; a non-streaming request can).

Safety: only loopback targets (127.0.0.0/8, ::1, or a name that resolves only to them) are accepted, unless
--allow-host names the host explicitly. Clients, duration and request count are bounded.

Python 3.11 standard library only. Examples:
  tools/loadgen.py http://127.0.0.1:18080/v1/completions --clients 4 --streaming-clients 2 --duration 25 \\
      --model tiny-llama --report reports/load.json --events reports/load.jsonl
  LOADGEN_API_KEY=... tools/loadgen.py http://127.0.0.1:8000/v1/completions --stop-file /tmp/stop
Exit status: 0 done, 1 more failures than --max-failed-* allow, 2 refused (target, arguments).
"""
from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections import Counter

MAX_CLIENTS = 256
MAX_DURATION = 24 * 3600.0
MAX_REQUESTS = 10_000_000


class Refused(Exception):
    """The run is refused before any request is sent."""


def check_target(url: str, allow_hosts=()) -> urllib.parse.SplitResult:
    """The parsed URL if its host may receive traffic: loopback only, or named in allow_hosts."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(f"not an http(s) URL: {url!r}")
    host = parts.hostname
    if host in allow_hosts:
        return parts
    try:
        addresses = {ipaddress.ip_address(host)}
    except ValueError:
        try:
            addresses = {ipaddress.ip_address(info[4][0].split("%")[0])
                         for info in socket.getaddrinfo(host, parts.port or 80, proto=socket.IPPROTO_TCP)}
        except OSError as exc:
            raise Refused(f"cannot resolve {host!r}: {exc}") from exc
    if not addresses or not all(a.is_loopback for a in addresses):
        raise Refused(f"refusing to send traffic to {host!r} ({', '.join(sorted(map(str, addresses)))}): only "
                      "loopback targets are allowed unless --allow-host names the host")
    return parts


class Run:
    """Shared state of one load run: limits, stop signal, records, counters."""

    def __init__(self, args, target: urllib.parse.SplitResult):
        self.args = args
        self.target = target
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.reserved = 0
        self.records: list[dict] = []
        self.events = open(args.events, "a", encoding="utf-8") if args.events else None  # noqa: SIM115
        self.started = time.time()
        self.deadline = time.monotonic() + args.duration
        self.stop_reason = "duration"

    def reserve(self) -> bool:
        """Take one request from the budget; False when the run must end."""
        with self.lock:
            if self.stop.is_set():
                return False
            if time.monotonic() >= self.deadline:
                self.end("duration")
                return False
            if self.args.stop_file and os.path.exists(self.args.stop_file):
                self.end("stop file")
                return False
            if self.reserved >= self.args.max_requests:
                self.end("max requests")
                return False
            self.reserved += 1
            return True

    def end(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def record(self, rec: dict) -> None:
        with self.lock:
            self.records.append(rec)
            if self.events:
                self.events.write(json.dumps(rec) + "\n")
                self.events.flush()


def request_body(args, streaming: bool) -> bytes:
    body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "stream": streaming}
    if args.model:
        body["model"] = args.model
    body.update(args.extra_body)
    return json.dumps(body).encode()


def one_request(run: Run, client: int, streaming: bool) -> dict:
    args, target = run.args, run.target
    path = target.path or "/"
    if target.query:
        path += "?" + target.query
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if streaming else "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    conn_class = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    rec = {"client": client, "streaming": streaming, "start": time.time()}
    conn = conn_class(target.hostname, target.port, timeout=args.timeout)
    try:
        conn.request("POST", path, body=request_body(args, streaming), headers=headers)
        resp = conn.getresponse()
        rec["status"] = resp.status
        if resp.getheader("X-Served-By"):
            rec["served_by"] = resp.getheader("X-Served-By")
        if resp.status != 200:
            rec.update(ok=False, error=f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace').strip()}")
        elif streaming:
            rec.update(read_stream(resp))
        else:
            data = json.loads(resp.read() or b"{}")
            ok = bool(data.get("choices"))
            rec.update(ok=ok, **({} if ok else {"error": f"no choices in the answer: {str(data)[:200]}"}))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        rec.update(ok=False, error=f"{type(exc).__name__}: {exc}".strip())
    finally:
        conn.close()
    rec["end"] = time.time()
    return rec


def read_stream(resp) -> dict:
    """Read server-sent events until `data: [DONE]`; a stream that ends before it failed."""
    chunks = 0
    while True:
        line = resp.readline()
        if not line:
            return {"ok": False, "error": f"stream ended before [DONE] after {chunks} event(s)", "events": chunks}
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return {"ok": chunks > 0, "events": chunks, **({} if chunks else {"error": "empty stream"})}
        try:
            event = json.loads(payload)
        except ValueError:
            return {"ok": False, "error": f"bad event: {payload[:200]!r}", "events": chunks}
        if isinstance(event, dict) and event.get("error"):
            return {"ok": False, "error": f"error event: {str(event['error'])[:200]}", "events": chunks}
        chunks += 1


def client_loop(run: Run, client: int, streaming: bool) -> None:
    while run.reserve():
        run.record(one_request(run, client, streaming))
        if run.args.pause:
            run.stop.wait(run.args.pause)


def summarize(run: Run) -> dict:
    recs = sorted(run.records, key=lambda r: r["start"])
    failed = [r for r in recs if not r["ok"]]
    per_second = Counter()
    for r in recs:
        per_second[(int(r["end"] - run.started), r["ok"])] += 1
    seconds = sorted({s for s, _count in per_second})
    return {
        "url": urllib.parse.urlunsplit(run.target),
        "started": run.started,
        "ended": time.time(),
        "stop_reason": run.stop_reason,
        "clients": run.args.clients,
        "streaming_clients": run.args.streaming_clients,
        "totals": {
            "sent": len(recs),
            "ok": len(recs) - len(failed),
            "failed": len(failed),
            "sent_streaming": sum(r["streaming"] for r in recs),
            "sent_non_streaming": sum(not r["streaming"] for r in recs),
            "failed_streaming": sum(r["streaming"] for r in failed),
            "failed_non_streaming": sum(not r["streaming"] for r in failed),
        },
        "errors": dict(Counter(r["error"] for r in failed).most_common()),
        "served_by": dict(Counter(r.get("served_by", "?") for r in recs if r["ok"]).most_common()),
        "per_second": [{"second": s, "ok": per_second[(s, True)], "failed": per_second[(s, False)]}
                       for s in seconds],
        "failures": failed[:1000],
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("url", help="e.g. http://127.0.0.1:18080/v1/completions")
    p.add_argument("--api-key", default=os.environ.get("LOADGEN_API_KEY", ""),
                   help="Bearer key (default $LOADGEN_API_KEY: keeps it off the command line)")
    p.add_argument("--model", default="", help="\"model\" of the requests (omitted if empty)")
    p.add_argument("--prompt", default="The quick brown fox")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--extra-body", type=json.loads, default={}, help="JSON object merged into every request body")
    p.add_argument("--clients", type=int, default=4, help=f"concurrent clients (1..{MAX_CLIENTS})")
    p.add_argument("--streaming-clients", type=int, default=None, help="how many of them stream (default: half)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds (at most 24 h)")
    p.add_argument("--max-requests", type=int, default=100_000, help="request budget of the whole run")
    p.add_argument("--stop-file", default="", help="stop when this file exists")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for one request")
    p.add_argument("--pause", type=float, default=0.0, help="seconds a client waits between two requests")
    p.add_argument("--report", default="", help="write the JSON report here (default: stdout)")
    p.add_argument("--events", default="", help="append one JSON line per request here")
    p.add_argument("--allow-host", action="append", default=[], help="a non-loopback host that may be targeted")
    p.add_argument("--max-failed-non-streaming", type=int, default=-1, help="exit 1 above this (-1: no limit)")
    p.add_argument("--max-failed-streaming", type=int, default=-1, help="exit 1 above this (-1: no limit)")
    args = p.parse_args(argv)
    if args.streaming_clients is None:
        args.streaming_clients = args.clients // 2
    if not 1 <= args.clients <= MAX_CLIENTS:
        p.error(f"--clients must be within 1..{MAX_CLIENTS}")
    if not 0 <= args.streaming_clients <= args.clients:
        p.error("--streaming-clients must be within 0..--clients")
    if not 0 < args.duration <= MAX_DURATION:
        p.error(f"--duration must be within 0..{MAX_DURATION:.0f} s")
    if not 1 <= args.max_requests <= MAX_REQUESTS:
        p.error(f"--max-requests must be within 1..{MAX_REQUESTS}")
    if not isinstance(args.extra_body, dict):
        p.error("--extra-body must be a JSON object")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        target = check_target(args.url, args.allow_host)
    except Refused as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    run = Run(args, target)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: run.end(signal.Signals(signum).name))
    threads = [threading.Thread(target=client_loop, args=(run, i, i < args.streaming_clients), daemon=True,
                                name=f"client-{i}") for i in range(args.clients)]
    for t in threads:
        t.start()
    while not run.stop.is_set():
        if time.monotonic() >= run.deadline:
            run.end("duration")
        elif args.stop_file and os.path.exists(args.stop_file):
            run.end("stop file")
        elif not any(t.is_alive() for t in threads):
            break
        run.stop.wait(0.2)
    for t in threads:
        t.join(args.timeout + 5)
    with run.lock:
        report = summarize(run)
        if run.events:
            run.events.close()
            run.events = None
    text = json.dumps(report, indent=2)
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    else:
        print(text)
    t = report["totals"]
    print(f"loadgen: {t['sent']} sent, {t['ok']} ok, {t['failed']} failed ({t['failed_streaming']} streaming, "
          f"{t['failed_non_streaming']} non-streaming), stopped by {report['stop_reason']}", file=sys.stderr)
    if 0 <= args.max_failed_non_streaming < t["failed_non_streaming"] or \
            0 <= args.max_failed_streaming < t["failed_streaming"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
