"""plugins/action/vllm_ready.py: the wait for a start, a slice at a time, with a line between slices
saying what it waits for, for how long and the limit; the last slice is the one that fails with the diagnosis. The
module's waiting itself runs on real vLLM in the fleet scenario (test_2_fleet.py, test_6 prints these lines)."""
import types

from ansible_collections.vllm_fleet.fleet.plugins.action import vllm_ready



def waits(monkeypatch, answers, **args):
    """Run the action against a module that answers `answers` in turn, each slice taking its whole timeout (a
    clock that the slices advance). Returns (result, the module arguments of each slice, the lines printed)."""
    clock, calls, lines = [1000.0], [], []
    monkeypatch.setattr(vllm_ready.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(vllm_ready.ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    monkeypatch.setattr(vllm_ready.display, "display", lines.append)

    def module(module_name, module_args, task_vars):
        calls.append(dict(module_args))
        answer = answers[len(calls) - 1]
        clock[0] += answer.pop("took", module_args["timeout"])
        return answer

    action = vllm_ready.ActionModule.__new__(vllm_ready.ActionModule)
    action._task = types.SimpleNamespace(args=dict({"unit": "vllm@main.service", "port": 8000, "model": "m"}, **args))
    action._execute_module = module
    return action.run(task_vars={"inventory_hostname": "gpu-1"}), calls, lines


def not_yet(last="/health answered 503"):
    return {"ready": False, "last": last, "unit_state": {"ActiveState": "activating", "SubState": "start"}}


def test_a_start_of_70_seconds_prints_two_lines_and_returns_the_whole_wait(monkeypatch):
    ready = {"ready": True, "start_to_ready": 68.5, "restarts": 0, "took": 10}
    result, calls, lines = waits(monkeypatch, [not_yet(), not_yet(), ready], timeout=900, progress_every=30)
    assert [c["timeout"] for c in calls] == [30, 30, 30] and [c["fail_on_timeout"] for c in calls] == [False] * 3
    assert lines == [
        "gpu-1: waiting for vllm@main.service (port 8000) to serve a completion: 30 s so far, at most 900 s;"
        " unit activating/start, /health answered 503",
        "gpu-1: waiting for vllm@main.service (port 8000) to serve a completion: 60 s so far, at most 900 s;"
        " unit activating/start, /health answered 503"]
    assert result["ready"] and result["seconds"] == 70.0 and result["start_to_ready"] == 68.5


def test_the_last_slice_takes_what_is_left_and_fails_with_the_diagnosis(monkeypatch):
    failed = {"failed": True, "msg": "vllm@main.service on port 8000 is not ready: not ready after 10s"}
    result, calls, lines = waits(monkeypatch, [not_yet(), not_yet(), failed], timeout=70, progress_every=30)
    assert [(c["timeout"], c["fail_on_timeout"]) for c in calls] == [(30, False), (30, False), (10, True)]
    assert len(lines) == 2 and result["failed"] and result["seconds"] == 70.0


def test_a_unit_that_fails_stops_the_wait_at_once(monkeypatch):
    failed = {"failed": True, "msg": "unit vllm@main.service is failed (result start-limit-hit)", "took": 3}
    result, calls, lines = waits(monkeypatch, [failed], timeout=900, progress_every=30)
    assert len(calls) == 1 and lines == [] and result["failed"] and result["seconds"] == 3.0


def test_progress_every_0_waits_in_one_run(monkeypatch):
    result, calls, lines = waits(monkeypatch, [{"ready": True, "took": 45}], timeout=900, progress_every=0)
    assert [(c["timeout"], c["fail_on_timeout"]) for c in calls] == [(900, True)] and lines == []
