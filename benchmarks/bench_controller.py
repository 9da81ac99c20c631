#!/usr/bin/env python3
"""The controller at fleet scale: playbooks against a generated inventory, beside Ansible's own floor (figures).

    .venv/bin/python benchmarks/bench_controller.py [--hosts 100 1000] [--forks 50] [--profile] [--roll
        [--roll-batches percent rack]]

For each size, an inventory of that many vLLM hosts with declared GPUs (nvidia_gpu_declared: nothing is contacted,
the connection is local) is generated: four GPU types, each with its catalog model, workload and policy, so the fleet
has four distinct configurations, as fleets do. Then, timed in the same run:

- the floor: one set_fact per host, the least a play over these hosts costs in Ansible;
- playbooks/plan.yml, which plans every host and prints the table;
- with --roll, playbooks/rolling_restart.yml itself, end to end on the controller: the roll lock and journal, the
  batches (10 % of the hosts, then one rack of 20 hosts each: rolling_restart_batch_by), the resume play, and per
  host the roll role's whole runbook with its capacity guard, events, journal records and report, then report.json,
  the table and timeline.png once. What touches a host or a balancer (the GPU read, drain, stop, start, the wait,
  enable, the balancers' server states) is a stand-in task file of one set_fact (STANDINS, in a copy of the
  collection whose other files are links to this checkout's, first in the collections path), so the time printed is the controller's own for the roll, and a real roll adds the
  hardware's: hosts / batch x (drain + stop + start) and each task's round trip to its host. Beside the roll in
  batches of 10 %, its floor: as many set_facts a host as the roll ran tasks on one, in the same batches (Ansible's
  per-host cost of such a play grows with the inventory; the roll is judged against that).

Printed: seconds, the ratio to the floor, and seconds per 1,000 hosts (a ratio that grows with the size is a cost
that grows faster than the fleet). Both run with ansible.cfg's callbacks (profile_tasks among them); --profile prints
the per-task profile of each playbook.

The runs may write Python's bytecode cache (PYTHONDONTWRITEBYTECODE is dropped from their environment): Ansible forks
a worker per host and task, and without the cache every worker compiles the project's plugins again, which is not
how a controller runs (measured here: 25 ms more a host on each task that loads the sizing package).
"""
import argparse
import json
import os
import re
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


# What the roll asks of a host or a balancer, answered as a fleet where every host serves and every start works:
# (role, task file) -> tasks. The roll's own role, lock, journal, batches and report are the real ones.
STANDINS = {
    ("nvidia_gpu", "facts"): [], ("nvidia_gpu", "recover"): [],
    ("vllm", "prefetch"): [], ("vllm", "stop"): [], ("vllm", "prefetch_wait"): [], ("vllm", "restart"): [],
    ("vllm", "ready"): [{"ansible.builtin.set_fact": {"vllm_ready_result": {"results": [
        {"item": {"name": "main"}, "start_to_ready": 30.0,
         "phases": {"weights_s": 1.0, "engine_init_s": 2.0, "other_s": 27.0, "first_completion_s": 0.1}}]}}}],
    ("balancer", "drain"): [], ("balancer", "enable"): [],
    # Every balancer has every vLLM host's server UP but those leaving with this batch.
    ("balancer", "status"): [{"ansible.builtin.set_fact": {
        "balancer_status_other_up": {"balancer-1": "{{ bench_up }}"}, "balancer_status_other_up_min": "{{ bench_up }}"},
        "vars": {"bench_up": "{{ groups['vllm'] | length - balancer_status_leaving_hosts"
                             " | union([balancer_target_host]) | length }}"}}],
}


# The roll's batchings: --roll-batches name -> (label, extra vars). The floor runs beside the 10 % one.
ROLL_BATCHES = {"percent": ("10 %", ("-e", "rolling_restart_serial=10%")),
                "rack": ("a rack", ("-e", "rolling_restart_batch_by=rack"))}


def standin_collection(directory):
    """The collection vllm_fleet.fleet under directory (a collections path), every file a link to this checkout's
    but the STANDINS' task files, each one set_fact unless it sets something. Returns directory."""
    root = os.path.join(directory, "ansible_collections", "vllm_fleet", "fleet")
    os.makedirs(root)
    for name in os.listdir(ROOT):
        if name not in ("roles", "collections", ".git", ".venv"):
            os.symlink(os.path.join(ROOT, name), os.path.join(root, name))
    for role in os.listdir(os.path.join(ROOT, "roles")):
        source = os.path.join(ROOT, "roles", role)
        os.makedirs(os.path.join(root, "roles", role, "tasks"))
        for name in os.listdir(source):
            if name != "tasks":
                os.symlink(os.path.join(source, name), os.path.join(root, "roles", role, name))
        for name in os.listdir(os.path.join(source, "tasks")):
            if (role, name[:-len(".yml")]) not in STANDINS:
                os.symlink(os.path.join(source, "tasks", name), os.path.join(root, "roles", role, "tasks", name))
    for (role, tasks_from), tasks in STANDINS.items():
        tasks = tasks or [{"ansible.builtin.set_fact": {"bench_standin": tasks_from}}]
        with open(os.path.join(root, "roles", role, "tasks", tasks_from + ".yml"), "w", encoding="utf-8") as out:
            yaml.safe_dump([{"name": "Stand-in for %s's %s" % (role, tasks_from), **task} for task in tasks], out)
    return directory


def inventory(hosts):
    """The fleet as a YAML inventory: one group per configuration under vllm, hosts named like a rack's."""
    groups = {}
    for index, (gpu, model, workload, policy) in enumerate(CONFIGURATIONS):
        # Racks of 20 hosts, each rack of one GPU type (as fleets are bought), for the roll's failure domains.
        members = {"gpu%d-%05d" % (index, n): {"rack": "rack-%d-%d" % (index, n // 80)}
                   for n in range(index, hosts, len(CONFIGURATIONS))}
        groups["gpu_type_%d" % index] = {
            "hosts": members,
            "vars": {"nvidia_gpu_declared": [gpu], "vllm_model": model, "vllm_workload": workload,
                     "vllm_policy": policy}}
    return {"all": {"vars": {"ansible_connection": "local", "ansible_host": "127.0.0.1",
                             "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                    "children": {"vllm": {"children": groups}}}}


def run(playbook, inventory_file, forks, profile, extra=(), collections_path=None):
    env = dict((key, value) for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE")
    if collections_path:
        env["ANSIBLE_COLLECTIONS_PATH"] = collections_path
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
    return seconds, done.stdout


def tasks_a_host(output):
    """Tasks the run ran or skipped on its busiest vLLM host, from its PLAY RECAP."""
    return max(int(ok) + int(skipped) for host, ok, skipped in re.findall(
        r"^(\S+)\s+: ok=(\d+)\s+changed=\d+\s+unreachable=\d+\s+failed=\d+\s+skipped=(\d+)", output, re.M)
        if host != "localhost")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--forks", type=int, default=50)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--roll", action="store_true", help="also time rolling_restart.yml with stand-in hosts")
    parser.add_argument("--roll-batches", nargs="+", choices=sorted(ROLL_BATCHES), default=sorted(ROLL_BATCHES),
                        help="which of the roll's batchings to time (default both)")
    args = parser.parse_args()
    print("controller: %d CPU(s), forks %d; %d configurations" % (os.cpu_count(), args.forks, len(CONFIGURATIONS)))
    with tempfile.TemporaryDirectory() as scratch:
        floor = os.path.join(scratch, "floor.yml")
        with open(floor, "w", encoding="utf-8") as out:
            yaml.safe_dump(FLOOR, out)
        standins = standin_collection(os.path.join(scratch, "standins"))
        for hosts in args.hosts:
            inventory_file = os.path.join(scratch, "fleet-%d.yml" % hosts)
            with open(inventory_file, "w", encoding="utf-8") as out:
                yaml.safe_dump(inventory(hosts), out)
            base, _ = run(floor, inventory_file, args.forks, args.profile)
            print("%6d hosts  floor (one set_fact a host)  %7.1f s  %6.1f s per 1,000 hosts"
                  % (hosts, base, base * 1000 / hosts))
            plan, _ = run("playbooks/plan.yml", inventory_file, args.forks, args.profile,
                       ("-e", "plan_out=%s" % os.path.join(scratch, "plan-%d.json" % hosts)))
            print("%6d hosts  playbooks/plan.yml           %7.1f s  %6.1f s per 1,000 hosts  %5.2fx the floor"
                  % (hosts, plan, plan * 1000 / hosts, plan / base))
            if args.roll:
                for batches, setting in (ROLL_BATCHES[name] for name in sorted(args.roll_batches)):
                    state = tempfile.mkdtemp(dir=scratch)
                    seconds, output = run("playbooks/rolling_restart.yml", inventory_file, args.forks, args.profile, (
                        *setting, "-e", "rolling_restart_lock_file=%s/lock" % state,
                        "-e", "rolling_restart_journal_dir=%s/journal" % state,
                        "-e", "rolling_restart_reports_dir=%s/reports" % state), standins)
                    check_roll(state, hosts)
                    print("%6d hosts  rolling_restart.yml, %-7s %7.1f s  %6.1f s per 1,000 hosts  %5.2fx the floor"
                          % (hosts, batches, seconds, seconds * 1000 / hosts, seconds / base))
                    if batches == "10 %":
                        # Ansible's own cost of a play as long as the roll: its per-host time grows with the
                        # inventory too, so the roll is judged against it, not against one task.
                        tasks = tasks_a_host(output)
                        long_floor = os.path.join(scratch, "floor-%d.yml" % tasks)
                        with open(long_floor, "w", encoding="utf-8") as out:
                            yaml.safe_dump([dict(FLOOR[0], serial="10%", tasks=[
                                {"name": "Task %d" % n, "ansible.builtin.set_fact": {"bench_floor": n}}
                                for n in range(tasks)])], out)
                        floor_seconds, _ = run(long_floor, inventory_file, args.forks, args.profile)
                        print("%6d hosts  its floor (%d set_facts, 10 %%) %6.1f s  %6.1f s per 1,000 hosts  the roll "
                              "%.2fx it" % (hosts, tasks, floor_seconds, floor_seconds * 1000 / hosts,
                                             seconds / floor_seconds))


def check_roll(state, hosts):
    """Stop the benchmark unless the simulated roll rolled every host, ok, wrote its table and timeline and left the
    roll journal empty: a time of a roll that did not happen is no figure."""
    (run_id,) = os.listdir(os.path.join(state, "reports"))
    run_dir = os.path.join(state, "reports", run_id)
    with open(os.path.join(run_dir, "report.json"), encoding="utf-8") as source:
        report = json.load(source)
    rolled = report["hosts"]
    if report["outcome"] != "ok" or len(rolled) != hosts or any(r["outcome"] != "ok" for r in rolled.values()):
        sys.exit("the simulated roll did not roll every host: %s" % json.dumps(report)[:2000])
    for name in ("table.txt", "timeline.png"):
        if not os.path.exists(os.path.join(run_dir, name)):
            sys.exit("the simulated roll wrote no %s in %s" % (name, run_dir))
    if os.listdir(os.path.join(state, "journal")):
        sys.exit("the simulated roll left hosts in the roll journal: %s" % os.listdir(os.path.join(state, "journal")))


if __name__ == "__main__":
    main()
