"""files/vllm-oom-counter: runtime OOMs (failure 2) counted from real vLLM log lines for node exporter's textfile
collector; startup OOMs and prompts that quote OOM text are not counted."""
import os

import pytest
from conftest import ROOT, load_file

ROLE = os.path.join(ROOT, "roles", "vllm")
LOGS = os.path.join(ROOT, "tests", "fixtures", "vllm-logs")
# On a host the script imports vllm_diagnosis from its own directory; here from the collection's module_utils, on
# the path from pytest.ini.
counter = load_file(os.path.join(ROLE, "files", "vllm-oom-counter"), "vllm_oom_counter")


def log(name):
    with open(os.path.join(LOGS, name), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("name, expected", [
    ("torch-oom-512-bytes.log", 1), ("torch-oom-kib.log", 1), ("kaito-976-fragmentation-v0.log", 1),
    ("club-3090-16-hint-not-fragmentation.log", 1),
    # Failure 1 and 3 without an OOM, and a prompt quoting OOM text: nothing to count.
    ("vllm-14092-load-model-oom.log", 0), ("cpu032-kv-startup.log", 0), ("cpu032-engine-dead.log", 0),
    ("prompts-with-failure-text.log", 0), ("cpu032-startup-eager.log", 0),
])
def test_counts_runtime_ooms_only(name, expected):
    assert counter.runtime_ooms(log(name)) == expected


def test_two_ooms_in_one_stretch_count_twice():
    text = log("torch-oom-512-bytes.log")
    assert counter.runtime_ooms(text + "\n" + log("serving-start.log") + "\n" + text) == 2


def test_textfile_format_is_what_node_exporter_reads():
    assert counter.render_textfile({"vllm@b.service": 2, "vllm@a.service": 0}) == (
        "# HELP vllm_fleet_runtime_oom_total Runtime out-of-memory failures vLLM logged, counted from the journal.\n"
        "# TYPE vllm_fleet_runtime_oom_total counter\n"
        'vllm_fleet_runtime_oom_total{name="vllm@a.service"} 0\n'
        'vllm_fleet_runtime_oom_total{name="vllm@b.service"} 2\n')


def lines(*names):
    """Fixtures joined into one journal, their source comments dropped (as test_vllm_diagnosis does)."""
    return [line for name in names for line in log(name).splitlines() if not line.startswith("# ")]


def counted(chunks):
    """The total after one tick per chunk of journal, as main() feeds count()."""
    entry = {"cursor": None, "total": 0, "context": []}
    for chunk in chunks:
        counter.count(entry, "\n".join(chunk))
    return entry


def test_a_startup_oom_a_tick_after_its_start_is_not_counted():
    """Issue: a GPU start takes minutes. vLLM loaded the weights in one tick (issue #8180: "Loading model weights
    took 8.1425 GB") and its cuBLAS OOM came in the next, with no start-up frame in its traceback: read alone, that
    tick says runtime OOM. With the start's earlier lines it is failure 1, not counted."""
    journal = lines("systemd-restart.log", "vllm-8180-cublas-startup.log")
    split = next(i for i, line in enumerate(journal) if "Loading model weights took" in line) + 1
    assert counter.runtime_ooms("\n".join(journal[split:])) == 1  # the bug: the second tick alone
    entry = counted([journal[:split], journal[split:]])
    assert entry["total"] == 0
    # The start never served: its lines stay the context of the next tick.
    assert entry["context"][0].startswith("Starting vllm@main.service")


def test_every_split_counts_what_the_whole_journal_holds():
    """A start that OOMs (not counted), the restart that serves, then a runtime OOM (counted once), cut into two
    ticks at every line: always the classifier's verdict on the whole journal, 1."""
    journal = lines("systemd-restart.log", "vllm-8180-cublas-startup.log", "systemd-restart.log",
                    "serving-start.log", "torch-oom-512-bytes.log")
    assert counter.runtime_ooms("\n".join(journal)) == 1
    for split in range(len(journal) + 1):
        assert counted([journal[:split], journal[split:]])["total"] == 1, split


def test_once_serving_only_a_short_tail_is_kept():
    entry = counted([lines("systemd-restart.log", "serving-start.log")])
    assert entry["total"] == 0 and entry["context"] == lines("systemd-restart.log", "serving-start.log")
    served = [line for line in lines("cpu032-enginecore-sigkill.log") if "POST /v1/completions" in line]
    noise = served * (2 * counter.TAIL_LINES)
    counter.count(entry, "\n".join(noise))
    assert entry["total"] == 0 and len(entry["context"]) == counter.TAIL_LINES
    # A runtime OOM in the next tick is counted.
    counter.count(entry, "\n".join(lines("torch-oom-512-bytes.log")))
    assert entry["total"] == 1
