"""vllm-unit-helper, the ExecStartPre/ExecStartPost of vllm@.service, against the stand-in nvidia-smi and a real
HTTP server on loopback."""
import http.server
import os
import subprocess
import sys
import threading

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HELPER = os.path.join(ROOT, "roles", "vllm", "files", "vllm-unit-helper")
STANDIN = os.path.join(ROOT, "tests", "fixtures", "nvidia-smi")
GPUS = os.path.join(ROOT, "tests", "fixtures", "gpus")


# On a host the role installs the collection's nvidia-smi reader next to the helper.
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")


def run(*args, fixture="h100-8.json", env=None):
    env = dict(os.environ, NVIDIA_SMI_STANDIN=os.path.join(GPUS, fixture), PYTHONPATH=MODULE_UTILS, **(env or {}))
    return subprocess.run([sys.executable, HELPER, *args], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def test_gpu_free_passes_when_the_instances_gpus_hold_nothing():
    # h100-8.json: GPUs 0 and 1 are held by a vLLM process, GPU 7 by nothing.
    out = run("gpu-free", "--nvidia-smi=" + STANDIN, "--timeout=1", "--gpus=7")
    assert out.returncode == 0, out.stderr


def test_gpu_free_times_out_naming_the_holders():
    out = run("gpu-free", "--nvidia-smi=" + STANDIN, "--timeout=2", env={"CUDA_VISIBLE_DEVICES": "0,7"})
    assert out.returncode == 1
    assert "GPU(s) 0,7 still in use after 2s" in out.stderr and "pid 30412" in out.stderr


def test_gpu_free_reads_a_process_name_holding_a_comma():
    # odd-names.json: GPU 1 is held by "/srv/models/run, v2/python3"; the helper used to die unpacking that row.
    out = run("gpu-free", "--nvidia-smi=" + STANDIN, "--timeout=1", "--gpus=1", fixture="odd-names.json")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "pid 777 (/srv/models/run, v2/python3) holds 1024 MiB" in out.stderr, out.stderr


def test_gpu_free_fails_clearly_when_the_driver_is_not_loaded():
    out = run("gpu-free", "--nvidia-smi=" + STANDIN, "--timeout=1", "--gpus=0", fixture="driver-not-loaded.json")
    assert out.returncode == 1 and "couldn't communicate with the NVIDIA driver" in out.stderr


class Health(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(Health.status)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_healthy_waits_for_200_and_gives_up_after_timeout():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = str(server.server_address[1])
    try:
        out = run("healthy", "--timeout=2", env={"VLLM_FLEET_PORT": port})
        assert out.returncode == 1 and "(last: HTTP 503)" in out.stderr
        Health.status = 200
        assert run("healthy", "--timeout=5", "--port=" + port).returncode == 0
    finally:
        server.shutdown()


def test_healthy_stops_when_the_server_process_is_gone():
    """systemd keeps waiting for ExecStartPost after the server exits; the helper must not."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        Health.status = 503
        out = run("healthy", "--timeout=30", "--port=%d" % server.server_address[1], env={"MAINPID": gone})
        assert out.returncode == 1 and f"(pid {gone}) exited" in out.stderr
    finally:
        server.shutdown()


def hf_cache(tmp_path):
    """A Hugging Face cache entry as the hub lays it out: blobs, and a snapshot of links to them."""
    entry = tmp_path / "hub" / "models--org--tiny"
    (entry / "blobs").mkdir(parents=True)
    snapshot = entry / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for name, blob, size in (("model-00001-of-00002.safetensors", "b1", 3 << 20),
                             ("model-00002-of-00002.safetensors", "b2", 1 << 20), ("config.json", "b3", 200)):
        (entry / "blobs" / blob).write_bytes(os.urandom(size))
        (snapshot / name).symlink_to(f"../../blobs/{blob}")
    return entry


def test_prefetch_reads_each_file_once_while_memory_allows(tmp_path):
    import json
    entry = hf_cache(tmp_path)
    out = run("prefetch", "--path", str(entry), "--reserve-mib", "0")
    assert out.returncode == 0, out.stderr
    read = json.loads(out.stdout)
    # Blobs and the snapshot's links to them are the same three files, read once.
    assert read["files"] == 3 and read["bytes"] == (4 << 20) + 200 and read["skipped_bytes"] == 0


def test_prefetch_keeps_the_reserve_and_reads_nothing_it_would_eat(tmp_path):
    import json
    entry = hf_cache(tmp_path)
    with open("/proc/meminfo") as handle:
        available_mib = next(int(line.split()[1]) for line in handle if line.startswith("MemAvailable:")) // 1024
    out = run("prefetch", "--path", str(entry), "--reserve-mib", str(available_mib + 1024))
    assert out.returncode == 0, out.stderr
    read = json.loads(out.stdout)
    assert read["files"] == 0 and read["bytes"] == 0 and read["skipped_bytes"] == (4 << 20) + 200


def test_prefetch_of_a_missing_directory_reads_nothing(tmp_path):
    out = run("prefetch", "--path", str(tmp_path / "absent"), "--reserve-mib", "0")
    assert out.returncode == 0 and '"files": 0' in out.stdout, out.stderr
