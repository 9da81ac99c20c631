"""playbooks/plan.yml end to end: declared GPUs, catalog models, nothing contacted, one row per host."""
import json
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_plan_prints_a_row_per_host_and_refuses_what_would_not_start(tmp_path):
    out_file = tmp_path / "plan.json"
    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "tests/playbooks/plan-inventory.yml",
         "playbooks/plan.yml", "-e", f"plan_out={out_file}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.strip().startswith('"') and " main " in line]
    assert len(rows) == 3, run.stdout[-3000:]
    by_host = {row.split()[0].strip('"'): row for row in rows}
    assert by_host["h100x8-gptoss"].rstrip('",').endswith("fits")
    assert "REFUSED" in by_host["t4-llama70b"] and "No available memory for the cache blocks" in by_host["t4-llama70b"]

    plans = json.loads(out_file.read_text())
    gptoss = plans["h100x8-gptoss"]["main"]
    assert gptoss["fits"] and gptoss["engine_args"]["max_model_len"] == 65536
    # Tensor parallelism on a 8-GPU host: the custom all-reduce conflict with expandable segments is handled.
    assert gptoss["engine_args"]["tensor_parallel_size"] > 1 and gptoss["engine_args"]["disable_custom_all_reduce"]
    # vLLM 0.34.0 (the role's default) has the startup plan: on.
    assert gptoss["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "VLLM_ENABLE_STARTUP_PLAN": "1"}
    # Serving options reach the plan; the block size is always explicit, decided for the H100 (compute 9.0).
    assert gptoss["engine_args"]["tool_call_parser"] == "openai" and gptoss["engine_args"]["enable_prefix_caching"]
    assert gptoss["engine_args"]["block_size"] == 64 and gptoss["attention_backend"] == "FLASH_ATTN"
    assert not plans["a10g-qwen3"]["main"]["fits"]


def test_options_are_checked_before_any_plan(tmp_path):
    """A misspelt policy key, a role-owned argument or a flag the planned vLLM lacks stops plan.yml with the
    variable named."""
    def plan(options, variable="vllm_serve_options"):
        return subprocess.run(
            [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "tests/playbooks/plan-inventory.yml",
             "playbooks/plan.yml", "--limit", "a10g-qwen3", "-e", json.dumps({variable: options}),
             "-e", f"plan_out={tmp_path / 'plan.json'}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
            env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"))
    owned = plan({"port": 9000, "dtype": "float16"})
    assert owned.returncode != 0 and "vllm_serve_options sets port (set vllm_instances[].port instead)" in owned.stdout
    typo = plan({"gpu_shareing": "shared"}, "vllm_policy")
    assert typo.returncode != 0 and "vllm_policy.gpu_shareing. Supported parameters include" in typo.stdout
    missing = plan({"swap_space": 4})
    assert missing.returncode != 0
    assert "policy.serve_options.swap_space: --swap-space does not exist in vLLM 0.34.0" in missing.stdout


def test_a_measured_start_is_planned_with_and_shown_beside_the_prediction(tmp_path):
    """The calibration store: an entry under the configuration's key (here the CPU build's own startup report of
    tests/fixtures/vllm-logs) makes the next plan use vLLM's KV figure, and the table shows both and the error."""
    import vllm_sizing
    import vllm_startup_report
    calibration = vllm_sizing.package().calibration

    def plan():
        return subprocess.run(
            [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "tests/playbooks/plan-inventory.yml",
             "playbooks/plan.yml", "--limit", "h100x8-gptoss,localhost", "-e", f"vllm_calibration_dir={tmp_path / 'store'}",
             "-e", f"plan_out={tmp_path / 'plan.json'}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
            env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"))
    before = plan()
    assert before.returncode == 0, before.stdout[-3000:]
    # An empty store is no reason for a warning (the fileglob lookups printed "Unable to find" per directory).
    assert "Unable to find" not in before.stdout + before.stderr
    predicted = json.loads((tmp_path / "plan.json").read_text())["h100x8-gptoss"]["main"]
    assert "calibration" not in predicted
    with open(os.path.join(ROOT, "tests", "fixtures", "vllm-logs", "cpu032-startup-eager.log"), encoding="utf-8") as f:
        report = vllm_startup_report.vllm_startup_report(f.read())
    key = calibration.calibration_key(predicted)
    entry = tmp_path / "store" / key / "h100x8-gptoss-main.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"key": key, "host": "h100x8-gptoss", "instance": "main",
                                 "started_at": "Fri 2026-12-04 15:37:28 UTC", "invocation_id": "0" * 32,
                                 "report": report}))
    after = plan()
    assert after.returncode == 0, after.stdout[-3000:]
    measured = json.loads((tmp_path / "plan.json").read_text())["h100x8-gptoss"]["main"]
    cal = measured["calibration"]
    assert cal["measured_kv_cache_bytes"] == 1 << 30 and cal["source"]["host"] == "h100x8-gptoss"
    assert cal["cpu_build"] and not cal["flagged"] and cal["error_percent"] is None
    # 1 GiB is far less than TP 2 was predicted to leave: that configuration no longer serves the workload.
    assert not cal["used"] and measured["engine_args"]["tensor_parallel_size"] > \
        predicted["engine_args"]["tensor_parallel_size"]
    assert any("does not serve the workload, so the plan moved on" in line for line in measured["applied"])
    row = next(line for line in after.stdout.splitlines() if "h100x8-gptoss" in line and " main " in line)
    assert " 1.00 " in row and "(measured on the CPU build: not comparable with a GPU prediction)" in row
    assert " %.2f " % (cal["predicted_kv_cache_bytes"] / (1 << 30)) in row and "%" not in row.split(" 1.00 ")[1][:9]


def test_a_load_test_that_held_fewer_sequences_caps_the_next_plan(tmp_path):
    """The load test's feed: tests/fixtures/loadtest/kv-holds-4-of-8.json judged by the load test's verdict and
    recorded as tasks/loadtest.yml records it, in loadtest/ under the configuration's key. plan.yml reads it, caps
    max_num_seqs at the 4 the KV cache held and says so in the table; no start entry is taken from it."""
    import vllm_sizing
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils import vllm_loadtest
    calibration = vllm_sizing.package().calibration

    def plan():
        return subprocess.run(
            [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "tests/playbooks/plan-inventory.yml",
             "playbooks/plan.yml", "--limit", "a10g-qwen3,localhost",
             "-e", json.dumps({"vllm_workload": {"p99_context": 1024, "peak_concurrency": 8}}),
             "-e", f"vllm_calibration_dir={tmp_path / 'store'}", "-e", f"plan_out={tmp_path / 'plan.json'}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
            env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"))
    before = plan()
    assert before.returncode == 0, before.stdout[-3000:]
    predicted = json.loads((tmp_path / "plan.json").read_text())["a10g-qwen3"]["main"]
    assert predicted["engine_args"]["max_num_seqs"] == 8
    with open(os.path.join(ROOT, "tests", "fixtures", "loadtest", "kv-holds-4-of-8.json"), encoding="utf-8") as f:
        fixture = json.load(f)
    stages = [vllm_loadtest.stage_summary(s["concurrency"], s["result"], s["samples"], s["timed_out"])
              for s in fixture["stages"]]
    found = vllm_loadtest.verdict(stages, [], predicted["engine_args"], 1024, 8, {})
    key = calibration.calibration_key(predicted)
    entry = tmp_path / "store" / key / "loadtest" / "a10g-qwen3-main.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"key": key, "host": "a10g-qwen3", "instance": "main",
                                 "started": "2026-12-04T15:37:28Z", "p99_context": 1024, "max_num_seqs": 8,
                                 "held_concurrency": found["held_concurrency"], "passed": found["passed"],
                                 "broken": [b["limit"] for b in found["broken"]]}))
    after = plan()
    assert after.returncode == 0, after.stdout[-3000:]
    capped = json.loads((tmp_path / "plan.json").read_text())["a10g-qwen3"]["main"]
    assert capped["engine_args"]["max_num_seqs"] == 4 and capped["loadtest"]["held_concurrency"] == 4
    assert "calibration" not in capped  # a load-test entry is never taken for a start's
    assert calibration.calibration_key(capped) == key
    row = next(line for line in after.stdout.splitlines() if "a10g-qwen3" in line and " main " in line)
    assert "fits (seqs capped: the load test on a10g-qwen3 held 4, the estimate allowed 8)" in row


def test_a_generated_fleet_gets_each_hosts_own_plan(tmp_path):
    """At scale, plan.yml must still give every host the plan the vllm_sizing filter gives that host alone: the
    fleet of benchmarks/bench_controller.py (four configurations), one host with a workload of its own, and a start
    measured on another host of one configuration in the calibration store, which every host of that configuration
    plans with."""
    import yaml
    import bench_controller
    import vllm_sizing
    import vllm_startup_report
    from ansible_collections.vllm_fleet.fleet.plugins.action import nvidia_gpu_facts as facts

    fleet = bench_controller.inventory(12)
    groups = fleet["all"]["children"]["vllm"]["children"]
    groups["gpu_type_0"]["hosts"]["gpu0-00004"] = {"vllm_workload": {"p99_context": 2048, "peak_concurrency": 64}}
    (tmp_path / "fleet.yml").write_text(yaml.safe_dump(fleet))
    version = yaml.safe_load(open(os.path.join(ROOT, "roles", "vllm", "defaults", "main.yml")))["vllm_version"]

    def alone(host, group, measured=None):
        settings = dict(group["vars"], **(group["hosts"][host] or {}))
        policy = dict(settings["vllm_policy"], host="%s (instance main)" % host, model=settings["vllm_model"],
                      vllm_version=version, serve_options={}, strict=False, measured=measured, loadtest=None)
        plan = vllm_sizing.vllm_sizing(facts.normalize_declared(settings["nvidia_gpu_declared"]),
                                       vllm_sizing.vllm_model(settings["vllm_model"]), settings["vllm_workload"], policy)
        return json.loads(json.dumps(plan))

    # A start of configuration 1, measured on a host that is not in this fleet.
    with open(os.path.join(ROOT, "tests", "fixtures", "vllm-logs", "cpu032-startup-eager.log"), encoding="utf-8") as f:
        report = vllm_startup_report.vllm_startup_report(f.read())
    some_host = next(iter(groups["gpu_type_1"]["hosts"]))
    key = vllm_sizing.vllm_calibration_key(alone(some_host, groups["gpu_type_1"]))
    entry = {"key": key, "host": "elsewhere", "instance": "main", "started_at": "Fri 2026-12-04 15:37:28 UTC",
             "invocation_id": "0" * 32, "report": report}
    (tmp_path / "store" / key).mkdir(parents=True)
    (tmp_path / "store" / key / "elsewhere-main.json").write_text(json.dumps(entry))

    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(tmp_path / "fleet.yml"),
         "playbooks/plan.yml", "-e", f"vllm_calibration_dir={tmp_path / 'store'}",
         "-e", f"plan_out={tmp_path / 'plan.json'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    plans = json.loads((tmp_path / "plan.json").read_text())
    assert len(plans) == 12
    for name, group in groups.items():
        for host in group["hosts"]:
            expected = alone(host, group, entry if name == "gpu_type_1" else None)
            assert plans[host] == {"main": expected}, host
    assert plans["gpu0-00004"]["main"]["engine_args"]["max_model_len"] == 2048
    assert all("calibration" in plans[host]["main"] for host in groups["gpu_type_1"]["hosts"])


def test_a_plan_that_a_start_changes_waits_for_the_next_apply(tmp_path):
    """After a start, the vllm role's calibration.yml files what vLLM printed and plans again with it. Here the start
    of h100x8-gptoss measured the CPU build's 1 GiB of KV (tests/fixtures/vllm-logs), with which the plan moves to a
    larger tensor parallelism. The unit still runs the plan it was started with (nothing rewrote its drop-in), so
    the plan file on the host must stay that one: the load test takes its concurrency from it and the next plain
    restart files its measurement under its key. The new plan is reported, for the next apply."""
    import vllm_startup_report
    with open(os.path.join(ROOT, "tests", "fixtures", "vllm-logs", "cpu032-startup-eager.log"), encoding="utf-8") as f:
        report = vllm_startup_report.vllm_startup_report(f.read())
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    phases = {"weights_s": 0.01, "engine_init_s": 0.68, "profile_s": None, "compile_s": None, "graphs_s": None,
              "other_s": 31.21, "first_completion_s": 0.05}
    book = tmp_path / "start.yml"
    book.write_text(json.dumps([{"hosts": "h100x8-gptoss", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "nvidia_gpu", "tasks_from": "facts"}},
        {"ansible.builtin.include_role": {"name": "vllm", "tasks_from": "plan"}},
        # What configure.yml writes with the unit's drop-in, and what the start's wait (ready.yml) returns.
        {"ansible.builtin.include_role": {"name": "vllm", "tasks_from": "plan_file"}},
        {"ansible.builtin.set_fact": {"vllm_ready_result": {"results": [
            {"item": {"name": "main", "port": 8000, "gpus": list(range(8))}, "startup": report, "phases": phases,
             "invocation_id": "0" * 32, "started_at": "Fri 2026-12-04 15:37:28 UTC"}]}}},
        {"ansible.builtin.include_role": {"name": "vllm", "tasks_from": "calibration"}}]}]))
    run = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "tests/playbooks/plan-inventory.yml", str(book),
         "-e", json.dumps({"vllm_calibration_dir": str(tmp_path / "store"), "vllm_config_dir": str(config_dir)})],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                 ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles")))
    assert run.returncode == 0, run.stdout[-3000:]
    entries = list((tmp_path / "store").rglob("h100x8-gptoss-main.json"))
    filed = json.loads(entries[0].read_text()) if len(entries) == 1 else entries
    # The start was filed with its phases, all but the first completion: a run without a restart measures another.
    kept = {key: value for key, value in phases.items() if key != "first_completion_s"}
    assert filed["report"] == report and filed["phases"] == kept
    on_host = json.loads((config_dir / "main.plan.json").read_text())
    assert on_host["engine_args"]["tensor_parallel_size"] == 2 and "calibration" not in on_host, on_host
    out = " ".join(run.stdout.split())
    assert "h100x8-gptoss instance main: with what its start measured, its plan changes" in out, out[-3000:]
    assert "tensor_parallel_size 2 -> 4" in out and "until then the plan file on the host is the one the unit runs" in out


def test_the_fleet_plan_is_each_hosts_own_per_host_plan(tmp_path):
    """plan.yml plans the declared hosts in one task on the controller, rendering each distinct configuration once
    (plugins/action/vllm_fleet_plan.py). Every host must get exactly what the per-host path (nvidia_gpu's
    facts, then vllm's plan, each behind its argument check) gives it, whatever its variables read: group and host
    variables, extra variables, templates over inventory_hostname, over hostvars, over a lookup, two instances, an
    invalid host (refused by both), a model directory and a host without declared GPUs (both left to that path)."""
    import re
    import yaml
    a10g = [{"name": "NVIDIA A10G", "memory_total_mib": 23028, "compute_capability": "8.6"}]
    l40s = [{"name": "NVIDIA L40S", "memory_total_mib": 46068, "compute_capability": "8.9", "count": 2}]
    model_dir = tmp_path / "Qwen3-8B"
    model_dir.mkdir()
    with open(os.path.join(ROOT, "filter_plugins", "vllm_models.json"), encoding="utf-8") as f:
        catalog = json.load(f)["Qwen/Qwen3-8B"]
    (model_dir / "config.json").write_text(json.dumps({k: v for k, v in catalog.items() if not k.startswith("_")}))
    fleet = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                     "children": {"vllm": {"children": {
        "same": {"vars": {"nvidia_gpu_declared": a10g, "vllm_model": "Qwen/Qwen3-8B",
                          "vllm_workload": {"p99_context": 8192, "peak_concurrency": 16},
                          "vllm_policy": {"gpu_sharing": "{{ sharing }}"}, "sharing": "dedicated"},
                 "hosts": {"same-1": None, "same-3": {"sharing": "shared"}, "same-2": {"vllm_workload": {
                    "p99_context": 8192, "peak_concurrency": "{{ lookup('ansible.builtin.env', 'FLEET_TEST_SEQS') | int }}"}}, "own-workload": {"vllm_workload": {"p99_context": 2048}},
                           "bad-policy": {"vllm_policy": {"gpu_shareing": "shared"}},
                           "model-dir": {"vllm_model_dir": str(model_dir)},
                           "nvidia-smi": {"nvidia_gpu_declared": [],
                                          "nvidia_gpu_nvidia_smi_path": os.path.join(ROOT, "tests/fixtures/nvidia-smi")},
                           "no-driver": {"nvidia_gpu_declared": [], "nvidia_gpu_nvidia_smi_path": "/nonexistent/nvidia-smi"}}},
        "templated": {"vars": {
            "nvidia_gpu_declared": l40s, "vllm_model": "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
            "nvidia_gpu_expected_count": "{{ hostvars[inventory_hostname].gpu_count }}", "gpu_count": 2,
            "vllm_workload": {"p99_context": "{{ 4096 * (inventory_hostname[-1] | int) }}", "peak_concurrency": 8},
            "vllm_policy": {"gpu_sharing": "{{ sharing }}"}, "sharing": "dedicated"},
            "hosts": {"tmpl-1": None, "tmpl-2": {"sharing": "shared"}, "tmpl-3": None,
                      "two-instances": {"vllm_workload": {"p99_context": 4096, "peak_concurrency": 4},
                                        "vllm_instances": [{"name": "a", "gpus": [0], "port": 8000},
                                                           {"name": "b", "gpus": [1], "port": 8001}]}}}}}}}}
    (tmp_path / "fleet.yml").write_text(yaml.safe_dump(fleet))
    per_host = tmp_path / "per-host"
    per_host.mkdir()
    (tmp_path / "per-host.yml").write_text(json.dumps([{"hosts": "vllm", "gather_facts": False, "tasks": [
        {"ansible.builtin.import_role": {"name": "nvidia_gpu", "tasks_from": "facts"}},
        {"ansible.builtin.import_role": {"name": "vllm", "tasks_from": "plan"}, "vars": {"vllm_plan_strict": False}},
        {"ansible.builtin.copy": {"content": "{{ vllm_plans | to_json }}", "dest": f"{per_host}/{{{{ inventory_hostname }}}}.json"},
         "delegate_to": "localhost"}]}]))
    extra = json.dumps({"vllm_serve_options": {"enable_prefix_caching": True}})
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles"), FLEET_TEST_SEQS="6",
               NVIDIA_SMI_STANDIN=os.path.join(ROOT, "tests/fixtures/gpus/a10g-1.json"))

    def run(playbook, *more):
        return subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(tmp_path / "fleet.yml"),
                               playbook, "-e", extra, *more],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env)
    fleet_run = run("playbooks/plan.yml", "-e", f"plan_out={tmp_path / 'plan.json'}")
    host_run = run(str(tmp_path / "per-host.yml"))
    # Both fail the invalid host, naming it and the variable, and the host without a driver, and only those.
    for done in (fleet_run, host_run):
        assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-2000:]
        assert "vllm_policy.gpu_shareing. Supported parameters include" in done.stdout
        assert "nvidia-smi not found (looked for '/nonexistent/nvidia-smi')" in done.stdout
        assert set(re.findall(r"^fatal: \[([^\] ]+)", done.stdout, re.M)) == {"bad-policy", "no-driver"}
        assert re.search(r"^no-driver +: .* failed=1 ", done.stdout, re.M), done.stdout[-2000:]
    # Only the hosts that must be contacted went through the per-host path.
    on_hosts = fleet_run.stdout.split("PLAY [Plan the other vLLM hosts")[1].split("PLAY [")[0]
    assert set(re.findall(r"^(?:ok|fatal): \[([^\]]+)\]", on_hosts, re.M)) == {"model-dir", "nvidia-smi", "no-driver"}, \
        on_hosts
    # Every host has a row, those without a plan too.
    assert re.search(r'"no-driver +- .*NO PLAN: see its error"', fleet_run.stdout), fleet_run.stdout[-3000:]
    plans = json.loads((tmp_path / "plan.json").read_text())
    expected = {path.stem: json.loads(path.read_text()) for path in per_host.glob("*.json")}
    assert sorted(expected) == sorted(fleet["all"]["children"]["vllm"]["children"]["same"]["hosts"].keys()
                                      - {"bad-policy", "no-driver"} | {"tmpl-1", "tmpl-2", "tmpl-3", "two-instances"})
    assert plans == expected
    # The templates did reach the plans: per-host context lengths and sharing, the lookup and the extra variable.
    assert [plans["tmpl-%d" % n]["main"]["engine_args"]["max_model_len"] for n in (1, 2, 3)] == [4096, 8192, 12288]
    for one, other in (("tmpl-1", "tmpl-2"), ("same-1", "same-3")):
        assert plans[one]["main"]["engine_args"]["gpu_memory_utilization"] != \
            plans[other]["main"]["engine_args"]["gpu_memory_utilization"]
    assert plans["same-2"]["main"]["engine_args"]["max_num_seqs"] == 6
    assert plans["same-1"]["main"]["engine_args"]["enable_prefix_caching"] is True
    assert sorted(plans["two-instances"]) == ["a", "b"] and plans["model-dir"]["main"]["model"] == str(model_dir)
    assert plans["nvidia-smi"]["main"]["gpus"]["name"] == "NVIDIA A10G"
