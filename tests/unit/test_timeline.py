"""Unit tests for tools/timeline.py: it renders a PNG from loadgen's events and the roll's host events."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("matplotlib")
import timeline  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = 1_790_000_000.0


def sample(tmp_path):
    requests = tmp_path / "load.jsonl"
    with requests.open("w") as f:
        for i in range(200):
            start = T0 + i * 0.1
            failed = i in (57, 58, 120)
            f.write(json.dumps({"client": i % 4, "streaming": i % 4 < 2, "start": start, "end": start + 0.3,
                                "ok": not failed, **({"error": "HTTP 500"} if failed else {})}) + "\n")
    hosts = tmp_path / "roll.json"
    events = []
    for n, host in enumerate(["gpu-01", "gpu-02"]):
        base = T0 + 2 + n * 8
        events += [{"time": base + dt, "host": host, "state": s}
                   for dt, s in ((0, "drained"), (1, "stopped"), (2, "starting"), (5, "ready"), (6, "enabled"))]
    # ISO 8601 times are accepted as well (what Ansible's now() writes).
    events[-1]["time"] = timeline.datetime.datetime.fromtimestamp(T0 + 16, timeline.datetime.timezone.utc).isoformat()
    hosts.write_text(json.dumps({"events": events}))
    return requests, hosts


def test_renders_a_png_from_a_sample(tmp_path):
    requests, hosts = sample(tmp_path)
    out = tmp_path / "roll.png"
    assert timeline.main(["--requests", str(requests), "--hosts", str(hosts), "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_command_line_and_report_input(tmp_path):
    requests, hosts = sample(tmp_path)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"started": T0, "per_second": [{"second": s, "ok": 9, "failed": s == 5}
                                                                for s in range(20)]}))
    out = tmp_path / "from-report.png"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "timeline.py"), "--requests", str(report),
                           "--hosts", str(hosts), "--out", str(out), "--title", "roll"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_loading_and_times():
    assert timeline.to_epoch("1970-01-01T00:01:00Z") == 60.0
    assert timeline.to_epoch("12.5") == 12.5
    assert timeline.to_epoch(7) == 7.0


def test_host_events_as_json_lines(tmp_path):
    _, hosts = sample(tmp_path)
    events = json.loads(hosts.read_text())["events"]
    lines = tmp_path / "hosts.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert timeline.load_host_events(str(lines)) == timeline.load_host_events(str(hosts))
    assert len(timeline.load_host_events(str(lines))) == len(events)


def test_nothing_to_draw_is_an_error(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert timeline.main(["--hosts", str(empty), "--out", str(tmp_path / "x.png")]) == 2


def test_a_fleet_larger_than_the_rows_is_drawn_as_hosts_per_state(tmp_path):
    """A roll of 300 hosts in batches of 30, with the roll's own states (start, draining, failed): one picture of
    the number of hosts in each state, not 300 rows (every state gets its color, however many hosts have it)."""
    events = []
    for i in range(300):
        base = T0 + (i // 30) * 60 + (i % 30) * 0.2
        steps = ((0, "start"), (1, "draining"), (6, "drained"), (13, "stopped"), (48, "ready"), (51, "enabled"))
        events += [{"time": base + dt, "host": f"gpu-{i:03d}", "state": s} for dt, s in steps]
    events.append({"time": T0 + 700, "host": "gpu-299", "state": "failed"})
    hosts = tmp_path / "report.json"
    hosts.write_text(json.dumps({"events": events}))
    out = tmp_path / "fleet.png"
    assert timeline.main(["--hosts", str(hosts), "--out", str(out)]) == 0
    png = out.read_bytes()
    assert png[:8] == PNG_MAGIC
    height = int.from_bytes(png[20:24], "big")  # the IHDR chunk: a fixed height, not one that grows with hosts
    assert height < 1000
