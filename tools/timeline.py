#!/usr/bin/env python3
"""Draw a rolling restart: request outcomes per second above, each host's state over time below (PNG).

Inputs:
  --requests FILE   the JSONL of tools/loadgen.py --events (one request per line: start, end, ok, streaming, ...)
                    or its JSON report (--report; uses the report's "per_second" and "started")
  --hosts FILE      host events written by the rolling restart: a JSON list (or {"events": [...]}, or JSON lines) of
                    {"time": epoch seconds or ISO 8601, "host": "gpu-01", "state": "drained"}; states seen so far:
                    drained, stopped, starting, ready, enabled (any other name gets a color too)
Output: --out FILE.png. Time 0 is the first request or host event. Up to 40 hosts get a row each; a larger fleet
gets the number of hosts in each state over time.

  tools/timeline.py --requests reports/load.jsonl --hosts reports/roll-events.json --out reports/roll.png
"""
from __future__ import annotations

import argparse
import bisect
import datetime
import itertools
import json
import sys
from collections import Counter

STATE_COLORS = {
    "enabled": "#2ca02c",   # in service
    "ready": "#98df8a",     # vLLM answers, not yet enabled in the balancers
    "starting": "#ffbb78",
    "stopped": "#d62728",
    "drained": "#1f77b4",   # out of the balancers, vLLM still running
    "draining": "#aec7e8",
    "start": "#c7c7c7",     # the roll took the host up, still serving
    "failed": "#8c564b",
}
EXTRA_COLORS = ["#9467bd", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
# More hosts than this and the lower panel counts the hosts in each state over time instead of one row per host
# (a row per host of a large fleet is thinner than a pixel).
MAX_HOST_ROWS = 40


def to_epoch(value) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().replace("Z", "+00:00")
    try:
        return float(text)
    except ValueError:
        parsed = datetime.datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.timezone.utc)
        return parsed.timestamp()


def read_json_or_lines(path: str):
    """The file's JSON document, or the list of its JSON lines when it is not one document."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_requests(path: str):
    """[(end_epoch, ok, streaming)] from a loadgen JSONL file, or per-second counts from its JSON report."""
    doc = read_json_or_lines(path)
    if isinstance(doc, dict) and "per_second" in doc:
        out = []
        for row in doc["per_second"]:
            t = doc["started"] + row["second"] + 0.5
            out += [(t, True, False)] * row["ok"] + [(t, False, False)] * row["failed"]
        return out
    records = [doc] if isinstance(doc, dict) else doc
    return [(to_epoch(r["end"]), bool(r["ok"]), bool(r.get("streaming"))) for r in records]


def load_host_events(path: str):
    # JSON lines too: one event each, appended as they happen (make demo's naive restart).
    doc = read_json_or_lines(path)
    events = doc.get("events", []) if isinstance(doc, dict) else doc
    return sorted(({"time": to_epoch(e["time"]), "host": str(e["host"]), "state": str(e["state"])} for e in events),
                  key=lambda e: e["time"])


def render(requests, host_events, out: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    times = [t for t, _ok, _streaming in requests] + [e["time"] for e in host_events]
    if not times:
        raise ValueError("nothing to draw: no request and no host event")
    t0, t_end = min(times), max(times)
    span = max(t_end - t0, 1.0)
    hosts = sorted({e["host"] for e in host_events})
    rows = len(hosts) if len(hosts) <= MAX_HOST_ROWS else 8

    fig, (ax_req, ax_host) = plt.subplots(
        2, 1, sharex=True, figsize=(12, 3.5 + 0.45 * max(rows, 1)),
        gridspec_kw={"height_ratios": [3, max(1, 0.6 * rows)]})

    seconds = int(span) + 1
    counts = {k: Counter() for k in ("ok", "fail_stream", "fail_plain")}
    for t, ok, streaming in requests:
        s = int(t - t0)
        counts["ok" if ok else "fail_stream" if streaming else "fail_plain"][s] += 1
    xs = list(range(seconds))
    ok = [counts["ok"][s] for s in xs]
    fail_plain = [counts["fail_plain"][s] for s in xs]
    fail_stream = [counts["fail_stream"][s] for s in xs]
    ax_req.bar(xs, ok, width=1.0, align="edge", color="#2ca02c", label="ok")
    ax_req.bar(xs, fail_plain, width=1.0, align="edge", bottom=ok, color="#d62728", label="failed (non-streaming)")
    ax_req.bar(xs, fail_stream, width=1.0, align="edge", bottom=[a + b for a, b in zip(ok, fail_plain)],
               color="#ff9896", hatch="//", label="failed (streaming)")
    for s in xs:  # a failure among hundreds of successes is a sliver: mark its second across the panel too
        if fail_plain[s] or fail_stream[s]:
            ax_req.axvspan(s, s + 1, color="#d62728", alpha=0.12, linewidth=0)
    total_failed = sum(fail_plain) + sum(fail_stream)
    ax_req.set_ylabel("requests ended / s")
    ax_req.set_title(title or f"{len(requests)} requests, {total_failed} failed "
                              f"({sum(fail_plain)} non-streaming, {sum(fail_stream)} streaming)")
    ax_req.legend(loc="upper right", fontsize="small")

    palette = dict(STATE_COLORS)
    extra = itertools.cycle(EXTRA_COLORS)
    for e in host_events:
        if e["state"] not in palette:
            palette[e["state"]] = next(extra)
    by_host = {host: [] for host in hosts}  # one pass: events are in time order, so each host's stay in order
    for e in host_events:
        by_host[e["host"]].append(e)
    spans = {host: [] for host in hosts}  # host: [(start, end, state)], each state until the host's next event
    for host, mine in by_host.items():
        for j, e in enumerate(mine):
            spans[host].append((e["time"], mine[j + 1]["time"] if j + 1 < len(mine) else t0 + span, e["state"]))
    if len(hosts) <= MAX_HOST_ROWS:
        for i, host in enumerate(hosts):
            for begin, end, state in spans[host]:
                ax_host.barh(i, max(end - begin, span / 500), left=begin - t0, height=0.6, color=palette[state],
                             edgecolor="white", linewidth=0.5)
        ax_host.set_yticks(range(len(hosts)), hosts)
        ax_host.set_ylim(-0.7, max(len(hosts), 1) - 0.3)
        ax_host.invert_yaxis()
    else:
        grid = [t0 + span * k / 1000 for k in range(1001)]
        states = [state for state in palette if any(e["state"] == state for e in host_events)]
        counts = {state: [0] * len(grid) for state in states}
        for host_spans in spans.values():
            for begin, end, state in host_spans:
                for k in range(bisect.bisect_left(grid, begin), bisect.bisect_left(grid, end)):
                    counts[state][k] += 1
        ax_host.stackplot([t - t0 for t in grid], [counts[state] for state in states],
                          colors=[palette[state] for state in states], step="post")
        ax_host.set_ylabel(f"hosts (of {len(hosts)})")
    start = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc)
    ax_host.set_xlabel(f"seconds since {start:%Y-%m-%d %H:%M:%S} UTC")
    ax_host.set_xlim(0, span)
    seen = [s for s in palette if any(e["state"] == s for e in host_events)]
    if seen:
        fig.legend(handles=[Patch(color=palette[s], label=s) for s in seen], loc="lower center",
                   fontsize="small", ncol=len(seen), frameon=False)
    fig.tight_layout(rect=(0, 0.05 if seen else 0, 1, 1))
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--requests", help="loadgen JSONL events or JSON report")
    p.add_argument("--hosts", help="JSON host events {time, host, state}")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    if not args.requests and not args.hosts:
        p.error("give --requests, --hosts or both")
    requests = load_requests(args.requests) if args.requests else []
    host_events = load_host_events(args.hosts) if args.hosts else []
    try:
        render(requests, host_events, args.out, args.title)
    except ValueError as exc:
        print(f"timeline: {exc}", file=sys.stderr)
        return 2
    print(f"timeline: {args.out}: {len(requests)} requests, {len(host_events)} host events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
