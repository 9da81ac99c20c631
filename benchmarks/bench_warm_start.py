#!/usr/bin/env python3
"""What a warm restart is worth on the CPU build of vLLM: start-to-first-completion cold and warm, same model, same
run, with and without torch.compile (figures, not pass/fail).

    $(VLLM_FLEET_CACHE)/vllm-venv/bin/python benchmarks/bench_warm_start.py MODEL_DIR [--timeout 900]

Run with the controller's vLLM venv (make controller-vllm). For each mode (--enforce-eager, then torch.compile):
- cold: an empty VLLM_CACHE_ROOT, and the model's files and the venv's (Python, torch, vLLM) dropped from the page
  cache (posix_fadvise DONTNEED: pages no other process maps), as after a host's reboot;
- warm: the same VLLM_CACHE_ROOT as the cold start left it, nothing dropped, as in a rolling restart that keeps
  its cache and reads the weights while the host drains (the roll's prefetch).

Printed per mode: seconds to /health 200 and to the first completion, cold and warm, the ratio, and what the cache
holds. What only a GPU host shows (weights of tens of GiB read from disk, CUDA-graph capture, the startup plan's
skipped profiling) is not here: a tiny model's weights are a few MiB, and the CPU worker skips the startup plan.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import check_controller_vllm  # noqa: E402  (the one way this project starts the controller's vLLM)

MODES = (("eager", ("--enforce-eager",)), ("torch.compile", ()))


def drop_page_cache(*roots):
    """Ask the kernel to drop the cached pages of every file under the roots; returns the bytes of those files."""
    total = 0
    for root in roots:
        for directory, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    total += os.fstat(fd).st_size
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    return total


def size_of(root):
    return sum(os.path.getsize(os.path.join(d, n)) for d, _s, names in os.walk(root) for n in names
               if os.path.isfile(os.path.join(d, n)))


def start(model_dir, args, cache_root, timeout):
    timings = {}
    with tempfile.TemporaryFile("w+") as log:
        failure = check_controller_vllm.serve_one(model_dir, timeout, log, args=args, timings=timings,
                                                  env={"VLLM_CACHE_ROOT": cache_root})
        if failure:
            log.seek(0)
            tail = [line for line in log.read().splitlines() if "leaked" not in line][-5:]
            failure += ": " + " | ".join(tail)
    return failure, timings


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    name, flags = check_controller_vllm.cpu_facts()
    print("CPU build of vLLM on %s (%d cores; %s), model %s" % (name, os.cpu_count(), " ".join(flags) or "-",
                                                               args.model_dir))
    print("%-14s %-5s %9s %12s %16s" % ("mode", "start", "ready (s)", "first (s)", "VLLM_CACHE_ROOT"))
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as scratch:
        for mode, mode_args in MODES:
            cache_root = os.path.join(scratch, mode.replace(".", "-"))
            os.makedirs(cache_root)
            runs = {}
            for kind in ("cold", "warm"):
                if kind == "cold":
                    dropped = drop_page_cache(args.model_dir, sys.prefix)
                    time.sleep(1)
                failure, timings = start(args.model_dir, mode_args, cache_root, args.timeout)
                if failure:
                    print("%-14s %-5s did not serve: %s" % (mode, kind, failure))
                    break
                runs[kind] = timings
                print("%-14s %-5s %9.1f %12.1f %13.1f MiB" % (mode, kind, timings["ready_s"], timings["completion_s"],
                                                              size_of(cache_root) / (1 << 20)))
            if len(runs) == 2:
                print("%-14s warm/cold %.2f (first completion; %.0f MiB dropped from the page cache for cold)"
                      % (mode, runs["warm"]["completion_s"] / runs["cold"]["completion_s"], dropped / (1 << 20)))


if __name__ == "__main__":
    main()
