#!/usr/bin/env python3
"""The controller at fleet scale: playbooks against a generated inventory, beside Ansible's own floor (figures).

    .venv/bin/python benchmarks/bench_controller.py [--hosts 100 1000] [--forks 50] [--profile]

For each size, an inventory of that many vLLM hosts with declared GPUs (nvidia_gpu_declared: nothing is contacted,
the connection is local) is generated: four GPU types, each with its catalog model, workload and policy, so the fleet
has four distinct configurations, as fleets do. Then, timed in the same run:

- the floor: one set_fact per host, the least a play over these hosts costs in Ansible;
- playbooks/plan.yml, which plans every host and prints the table;
- with --roll-report, the roll's report path alone (roles/rolling_restart/tasks/report.yml after a host's events, in
  batches of 10 %): what every host of a roll pays to record itself, and the run's report.json, table and
  timeline.png made once at the end, nothing restarted.

Printed: seconds, the ratio to the floor, and seconds per 1,000 hosts (a ratio that grows with the size is a cost
that grows faster than the fleet). Both run with ansible.cfg's callbacks (profile_tasks among them); --profile prints
the per-task profile of each playbook.

The runs may write Python's bytecode cache (PYTHONDONTWRITEBYTECODE is dropped from their environment): Ansible forks
a worker per host and task, and without the cache every worker compiles the project's plugins again, which is not
how a controller runs (measured here: 25 ms more a host on each task that loads the sizing package).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# GPU type (nvidia-smi's name, total MiB, compute capability, count) with the model, workload and policy it serves.
CONFIGURATIONS = [
    ({"name": "NVIDIA A10G", "memory_total_mib": 23028, "compute_capability": "8.6", "count": 1},
     "Qwen/Qwen3-8B", {"p99_context": 8192, "peak_concurrency": 16}, {}),
    ({"name": "NVIDIA L40S", "memory_total_mib": 46068, "compute_capability": "8.9", "count": 2},
     "mistralai/Mistral-Small-3.1-24B-Instruct-2503", {"p99_context": 16384, "peak_concurrency": 8},
     {"runtime_ooms": True}),
    ({"name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "compute_capability": "8.0", "count": 4},
     "meta-llama/Llama-3.1-70B-Instruct", {"p99_context": 32768, "peak_concurrency": 16}, {}),
    ({"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": "9.0", "count": 8},
     "openai/gpt-oss-120b", {"p99_context": 65536, "peak_concurrency": 64}, {"gpu_sharing": "shared"}),
]

FLOOR = [{"name": "Floor", "hosts": "vllm", "gather_facts": False,
          "tasks": [{"name": "One task per host", "ansible.builtin.set_fact": {"bench_floor": True}}]}]


# The roll's report step for hosts whose roll went well (the events tasks/main.yml records), in the roll's batches.
ROLL_REPORT = [{"name": "The roll's report path", "hosts": "vllm", "gather_facts": False, "serial": "10%", "tasks": [
    {"name": "Events of a roll that went well", "ansible.builtin.set_fact": {
        "rolling_restart_events": [{"time": float(n), "host": "{{ inventory_hostname }}", "state": state}
                                   for n, state in enumerate(("start", "drained", "stopped", "ready", "enabled"))],
        "rolling_restart_outcome": "ok", "rolling_restart_error": ""}},
    {"name": "Record the host (and, after the last batch, the run's report)",
     "ansible.builtin.include_role": {"name": "rolling_restart", "tasks_from": "report"}}]}]


def inventory(hosts):
    """The fleet as a YAML inventory: one group per configuration under vllm, hosts named like a rack's."""
    groups = {}
    for index, (gpu, model, workload, policy) in enumerate(CONFIGURATIONS):
        members = {"gpu%d-%05d" % (index, n): None for n in range(index, hosts, len(CONFIGURATIONS))}
        groups["gpu_type_%d" % index] = {
            "hosts": members,
            "vars": {"nvidia_gpu_declared": [gpu], "vllm_model": model, "vllm_workload": workload,
                     "vllm_policy": policy}}
    return {"all": {"vars": {"ansible_connection": "local", "ansible_host": "127.0.0.1",
                             "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                    "children": {"vllm": {"children": groups}}}}


def run(playbook, inventory_file, forks, profile, extra=()):
    env = dict((key, value) for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE")
    env.update(ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORKS=str(forks),
               ANSIBLE_FORCE_COLOR="0", PROFILE_TASKS_TASK_OUTPUT_LIMIT="12")
    started = time.perf_counter()
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory_file,
                           playbook, *extra], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit("%s failed (rc %d):\n%s%s" % (playbook, done.returncode, done.stdout[-4000:], done.stderr[-2000:]))
    if profile:
        lines = done.stdout.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("=====")), len(lines))
        print("\n".join("      " + line for line in lines[start - 1:] if line.strip()))
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--forks", type=int, default=50)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--roll-report", action="store_true", help="also time the roll's report path")
    args = parser.parse_args()
    print("controller: %d CPU(s), forks %d; %d configurations" % (os.cpu_count(), args.forks, len(CONFIGURATIONS)))
    with tempfile.TemporaryDirectory() as scratch:
        floor, roll_report = os.path.join(scratch, "floor.yml"), os.path.join(scratch, "roll-report.yml")
        for path, play in ((floor, FLOOR), (roll_report, ROLL_REPORT)):
            with open(path, "w", encoding="utf-8") as out:
                yaml.safe_dump(play, out)
        for hosts in args.hosts:
            inventory_file = os.path.join(scratch, "fleet-%d.yml" % hosts)
            with open(inventory_file, "w", encoding="utf-8") as out:
                yaml.safe_dump(inventory(hosts), out)
            base = run(floor, inventory_file, args.forks, args.profile)
            print("%6d hosts  floor (one set_fact a host)  %7.1f s  %6.1f s per 1,000 hosts"
                  % (hosts, base, base * 1000 / hosts))
            plan = run("playbooks/plan.yml", inventory_file, args.forks, args.profile,
                       ("-e", "plan_out=%s" % os.path.join(scratch, "plan-%d.json" % hosts)))
            print("%6d hosts  playbooks/plan.yml           %7.1f s  %6.1f s per 1,000 hosts  %5.2fx the floor"
                  % (hosts, plan, plan * 1000 / hosts, plan / base))
            if args.roll_report:
                run_dir = os.path.join(scratch, "roll-%d" % hosts)
                os.makedirs(os.path.join(run_dir, "hosts"))  # as tasks/run_dir.yml makes it for a roll
                seconds = run(roll_report, inventory_file, args.forks, args.profile,
                              ("-e", "rolling_restart_run_dir=%s" % run_dir))
                print("%6d hosts  the roll's report path       %7.1f s  %6.1f s per 1,000 hosts  %5.2fx the floor"
                      % (hosts, seconds, seconds * 1000 / hosts, seconds / base))


if __name__ == "__main__":
    main()
