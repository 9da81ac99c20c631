"""Unit tests for plugins/modules/nvidia_gpu_facts.py and the nvidia-smi stand-in.

The parsers are tested on nvidia-smi output as NVIDIA prints it; the stand-in is tested by reading its output
back with the module's parser (round trip) and by running the whole module against it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "nvidia_gpu"
COLLECTIONS = REPO / "collections"
MODULE = REPO / "plugins" / "modules" / "nvidia_gpu_facts.py"
STANDIN = REPO / "tests" / "fixtures" / "nvidia-smi"
FIXTURES = REPO / "tests" / "fixtures" / "gpus"

from ansible_collections.vllm_fleet.fleet.plugins.modules import nvidia_gpu_facts as m  # noqa: E402

# The action plugin of the same name: declared GPUs and the count check, on the controller.
from ansible_collections.vllm_fleet.fleet.plugins.action import nvidia_gpu_facts as action  # noqa: E402

A10G = "0, NVIDIA A10G, GPU-5e8f3f2a-2b8e-4c2e-9a43-0c1e6a7b9d01, 23028, 1, 550.144.03, 8.6, [N/A], 0"
DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


# --- GPU query -------------------------------------------------------------------------------------------------


def test_one_gpu():
    assert m.parse_gpu_csv(A10G + "\n") == [
        {
            "index": 0,
            "name": "NVIDIA A10G",
            "uuid": "GPU-5e8f3f2a-2b8e-4c2e-9a43-0c1e6a7b9d01",
            "memory_total_mib": 23028,
            "memory_used_mib": 1,
            "driver_version": "550.144.03",
            "compute_capability": "8.6",
            "mig_mode": None,
            "minor_number": 0,
        }
    ]


def test_several_gpus_sorted_by_index():
    text = "\n".join(
        "%d, NVIDIA H100 80GB HBM3, GPU-0000000%d-6c1d-4a7e-8f2b-1e55c0de0000, 81559, %d, 550.144.03, 9.0, Disabled, %d"
        % (i, i, used, minor)
        for i, used, minor in ((2, 0, 1), (0, 74525, 2), (1, 3, 0))
    )
    gpus = m.parse_gpu_csv(text)
    assert [gpu["index"] for gpu in gpus] == [0, 1, 2]
    assert [gpu["minor_number"] for gpu in gpus] == [2, 0, 1]  # the device node is not always the index
    assert [gpu["memory_used_mib"] for gpu in gpus] == [74525, 3, 0]
    assert {gpu["mig_mode"] for gpu in gpus} == {"Disabled"}
    assert all(gpu["memory_total_mib"] == 81559 and gpu["compute_capability"] == "9.0" for gpu in gpus)


@pytest.mark.parametrize("placeholder", ["[N/A]", "[Not Supported]", "[Unknown Error]", "N/A"])
def test_unavailable_values_become_null(placeholder):
    line = "0, NVIDIA L4, GPU-1, %s, %s, 550.144.03, 8.9, %s, %s" % ((placeholder,) * 4)
    gpu = m.parse_gpu_csv(line)[0]
    assert gpu["memory_total_mib"] is None and gpu["minor_number"] is None
    assert gpu["memory_used_mib"] is None
    assert gpu["mig_mode"] is None


def test_mig_modes():
    text = "\n".join(
        [
            "0, NVIDIA A100-SXM4-80GB, GPU-a, 81920, [N/A], 550.144.03, 8.0, Enabled, 0",
            "1, NVIDIA A100-SXM4-80GB, GPU-b, 81920, 4, 550.144.03, 8.0, Disabled, 1",
            "2, NVIDIA A10G, GPU-c, 23028, 1, 550.144.03, 8.6, [N/A], 2",
        ]
    )
    gpus = m.parse_gpu_csv(text)
    assert [gpu["mig_mode"] for gpu in gpus] == ["Enabled", "Disabled", None]
    assert gpus[0]["memory_used_mib"] is None


def test_name_containing_comma_and_space():
    line = "0, Example GPU, Rev. B, GPU-aaaa, 16384, 0, 550.144.03, 7.5, [N/A], 0"
    gpu = m.parse_gpu_csv(line)[0]
    assert gpu["name"] == "Example GPU, Rev. B"
    assert gpu["uuid"] == "GPU-aaaa"
    assert gpu["memory_total_mib"] == 16384


def test_quoted_name_is_read_as_csv():
    gpu = m.parse_gpu_csv('0, "Example, GPU", GPU-aaaa, 16384, 0, 550.144.03, 7.5, Disabled, 0')[0]
    assert gpu["name"] == "Example, GPU"


def test_header_and_units_are_tolerated():
    text = (
        "index, name, uuid, memory.total [MiB], memory.used [MiB], driver_version, compute_cap, mig.mode.current, "
        "minor_number\n"
        "0, NVIDIA A10G, GPU-x, 23028 MiB, 1 MiB, 550.144.03, 8.6, [N/A], 0\n"
    )
    gpu = m.parse_gpu_csv(text)[0]
    assert (gpu["memory_total_mib"], gpu["memory_used_mib"]) == (23028, 1)


def test_empty_gpu_output_is_no_gpu():
    assert m.parse_gpu_csv("") == []


@pytest.mark.parametrize(
    "line, expected",
    [
        ("0, NVIDIA A10G, GPU-x, 23028, 1, 550.144.03, 8.6, [N/A]", "expected 9 comma-separated values"),
        ("Failed to initialize NVML: Driver/library version mismatch", "expected 9 comma-separated values"),
        ("x, NVIDIA A10G, GPU-x, 23028, 1, 550.144.03, 8.6, [N/A], 0", "index is not an integer: 'x'"),
        ("0, NVIDIA A10G, GPU-x, 22 GiB, 1, 550.144.03, 8.6, [N/A], 0", "memory.total is not an integer"),
        ("0, NVIDIA A10G, GPU-x, 23028, 1, 550.144.03, 8.6, Maybe, 0", "unexpected mig.mode.current 'Maybe'"),
        ("0, NVIDIA A10G, GPU-x, 23028, 1, 550.144.03, eight, [N/A], 0", "compute_cap is not major.minor"),
        ("0, NVIDIA A10G, [N/A], 23028, 1, 550.144.03, 8.6, [N/A], 0", "uuid is unavailable"),
        ("0, NVIDIA A10G, GPU-x, 23028, 1, 550.144.03, 8.6, [N/A], one", "minor_number is not an integer"),
    ],
)
def test_malformed_gpu_line_is_a_clear_error(line, expected):
    with pytest.raises(m.NvidiaSmiParseError) as error:
        m.parse_gpu_csv(line)
    assert expected in str(error.value)
    assert repr(line) in str(error.value)


def test_duplicate_uuid_is_an_error():
    text = "0, A, GPU-x, 1, 1, 550.1, 8.6, [N/A], 0\n1, A, GPU-x, 1, 1, 550.1, 8.6, [N/A], 1"
    with pytest.raises(m.NvidiaSmiParseError, match="duplicate GPU uuid"):
        m.parse_gpu_csv(text)


# --- process query ---------------------------------------------------------------------------------------------


def test_processes():
    text = (
        "GPU-a, 30412, /opt/vllm/venv/bin/python3, 74516\n"
        "GPU-b, 778, [Insufficient Permissions], [N/A]\n"
        "GPU-a, 777, /srv/models/run, v2/python3, 1024\n"
    )
    assert m.parse_process_csv(text) == [
        {"gpu_uuid": "GPU-a", "pid": 30412, "process_name": "/opt/vllm/venv/bin/python3", "used_memory_mib": 74516},
        {"gpu_uuid": "GPU-b", "pid": 778, "process_name": None, "used_memory_mib": None},
        {"gpu_uuid": "GPU-a", "pid": 777, "process_name": "/srv/models/run, v2/python3", "used_memory_mib": 1024},
    ]


@pytest.mark.parametrize("text", ["", "\n", "No running processes found\n"])
def test_empty_process_list(text):
    assert m.parse_process_csv(text) == []


def test_malformed_process_line():
    with pytest.raises(m.NvidiaSmiParseError, match="expected 4 comma-separated values"):
        m.parse_process_csv("GPU-a, 30412\n")
    with pytest.raises(m.NvidiaSmiParseError, match="pid is not an integer"):
        m.parse_process_csv("GPU-a, python3, 30412, 10\n")


# --- commands and messages -------------------------------------------------------------------------------------


def test_commands_are_the_documented_queries():
    assert m.gpu_query_command("nvidia-smi") == [
        "nvidia-smi",
        "--query-gpu=index,name,uuid,memory.total,memory.used,driver_version,compute_cap,mig.mode.current,"
        "minor_number",
        "--format=csv,noheader,nounits",
    ]
    assert m.process_query_command("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi",
        "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
        "--format=csv,noheader,nounits",
    ]


def test_failure_message_carries_output_code_and_hint():
    message = m.failure_message(["nvidia-smi", "-q"], 9, DRIVER_NOT_LOADED + "\n", "")
    assert "exit code 9" in message
    assert DRIVER_NOT_LOADED in message
    assert "not loaded" in message and "reboot" in message


def test_not_installed_message_names_the_variables():
    message = m.not_installed_message("nvidia-smi")
    assert "driver is not installed" in message
    assert "nvidia_gpu_install_driver" in message and "nvidia_gpu_nvidia_smi_path" in message


# --- declared GPUs ---------------------------------------------------------------------------------------------


def test_declared_count_expands_and_fills_defaults():
    gpus = action.normalize_declared(
        [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "compute_capability": 9.0, "count": 2}]
    )
    assert gpus == [
        {
            "index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": None,
            "memory_total_mib": 81559,
            "memory_used_mib": None,
            "driver_version": None,
            "compute_capability": "9.0",
            "mig_mode": "Disabled",
            "minor_number": None,
        }
        for i in (0, 1)
    ]


def test_declared_keeps_given_values():
    gpu = action.normalize_declared(
        [
            {
                "index": 3,
                "name": "NVIDIA A10G",
                "uuid": "GPU-x",
                "memory_total_mib": "23028",
                "memory_used_mib": 0,
                "driver_version": "550.144.03",
                "compute_capability": "8.6",
                "mig_mode": None,
            }
        ]
    )[0]
    assert gpu["index"] == 3 and gpu["memory_total_mib"] == 23028 and gpu["mig_mode"] is None


@pytest.mark.parametrize(
    "item, expected",
    [
        ({"name": "A", "memory_total_gib": 24, "compute_capability": "8.6"}, "unknown keys ['memory_total_gib']"),
        ({"name": "A", "compute_capability": "8.6"}, "lacks memory_total_mib"),
        ({"name": "A", "memory_total_mib": "lots", "compute_capability": "8.6"}, "must be an integer"),
        ({"name": "A", "memory_total_mib": 1, "compute_capability": "sm_86"}, "compute_capability must look like"),
        ({"name": "A", "memory_total_mib": 1, "compute_capability": "8.6", "count": 0}, "count must be"),
        ({"name": "A", "memory_total_mib": 1, "compute_capability": "8.6", "mig_mode": "on"}, "mig_mode must be"),
    ],
)
def test_declared_errors(item, expected):
    with pytest.raises(ValueError) as error:
        action.normalize_declared([item])
    assert expected in str(error.value)
    assert "declared[0]" in str(error.value)


# --- stand-in nvidia-smi ---------------------------------------------------------------------------------------


def run_standin(args, fixture):
    env = dict(os.environ, NVIDIA_SMI_STANDIN=str(fixture))
    return subprocess.run([str(STANDIN)] + args, capture_output=True, text=True, env=env, check=False)


def expected_facts(fixture):
    """The facts the fixture describes, in the interfaces.md shape."""
    host = json.loads(fixture.read_text())
    gpus = [
        {
            "index": gpu["index"],
            "name": gpu["name"],
            "uuid": gpu["uuid"],
            "memory_total_mib": _null(gpu.get("memory_total_mib")),
            "memory_used_mib": _null(gpu.get("memory_used_mib")),
            "driver_version": gpu.get("driver_version", host.get("driver_version")),
            "compute_capability": gpu["compute_capability"],
            "mig_mode": _null(gpu.get("mig_mode")),
            "minor_number": _null(gpu.get("minor_number")),
        }
        for gpu in host["gpus"]
    ]
    processes = [{key: _null(process.get(key)) for key in m.PROCESS_KEYS} for process in host.get("processes", [])]
    return sorted(gpus, key=lambda gpu: gpu["index"]), processes


def _null(value):
    """A bracketed status string in a fixture stands for an unavailable value."""
    return None if isinstance(value, str) and value.startswith("[") else value


QUERY_FIXTURES = sorted(path for path in FIXTURES.glob("*.json") if "gpus" in json.loads(path.read_text()))


def test_fixture_set():
    names = {path.name for path in FIXTURES.glob("*.json")}
    assert {"a10g-1.json", "h100-8.json", "mig.json", "driver-not-loaded.json"} <= names


@pytest.mark.parametrize("fixture", QUERY_FIXTURES, ids=lambda path: path.stem)
def test_standin_round_trip(fixture):
    gpus, processes = expected_facts(fixture)
    gpu_run = run_standin(m.gpu_query_command("nvidia-smi")[1:], fixture)
    assert (gpu_run.returncode, gpu_run.stderr) == (0, "")
    assert m.parse_gpu_csv(gpu_run.stdout) == gpus
    process_run = run_standin(m.process_query_command("nvidia-smi")[1:], fixture)
    assert (process_run.returncode, process_run.stderr) == (0, "")
    assert m.parse_process_csv(process_run.stdout) == processes


def test_standin_prints_what_nvidia_smi_prints():
    result = run_standin(m.gpu_query_command("nvidia-smi")[1:], FIXTURES / "a10g-1.json")
    assert result.stdout == A10G + "\n"
    result = run_standin(m.process_query_command("nvidia-smi")[1:], FIXTURES / "a10g-1.json")
    assert (result.returncode, result.stdout) == (0, "")


def test_standin_any_field_order_with_header_and_units():
    fields = "--query-gpu=memory.total,uuid,gpu_name,mig.mode.current"
    result = run_standin([fields, "--format=csv"], FIXTURES / "mig.json")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "memory.total [MiB], uuid, name, mig.mode.current",
        "81920 MiB, GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16, NVIDIA A100-SXM4-80GB, Enabled",
        "81920 MiB, GPU-2b1f9c44-0e8e-4f1c-b0a9-3d6f1c7e5a42, NVIDIA A100-SXM4-80GB, Disabled",
    ]
    result = run_standin(["--query-compute-apps", "pid,used_memory", "--format", "csv,nounits"], FIXTURES / "mig.json")
    assert result.stdout.splitlines() == ["pid, used_gpu_memory [MiB]", "5120, [N/A]"]


def test_standin_driver_not_loaded():
    result = run_standin(m.gpu_query_command("nvidia-smi")[1:], FIXTURES / "driver-not-loaded.json")
    assert result.returncode == 9
    assert result.stdout.strip() == DRIVER_NOT_LOADED
    assert result.stderr == ""


def test_standin_rejects_unknown_field_and_option():
    result = run_standin(["--query-gpu=name,cuda_version", "--format=csv"], FIXTURES / "a10g-1.json")
    assert (result.returncode, result.stdout) == (2, 'Field "cuda_version" is not a valid field to query.\n')
    result = run_standin(["--frobnicate"], FIXTURES / "a10g-1.json")
    assert result.returncode == 2
    assert result.stdout == "ERROR: Option --frobnicate is not recognized. Please run 'nvidia-smi -h' for help.\n"
    result = run_standin(["--query-gpu=name", "--format=csv,fancy"], FIXTURES / "a10g-1.json")
    assert result.returncode == 2


def test_standin_no_devices(tmp_path):
    fixture = tmp_path / "none.json"
    fixture.write_text(json.dumps({"driver_version": "550.144.03", "gpus": []}))
    result = run_standin(m.gpu_query_command("nvidia-smi")[1:], fixture)
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")


# --- the whole module ------------------------------------------------------------------------------------------


def run_module(args, tmp_path, env=None):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    # As Ansible runs it: the collection's module_utils importable by their namespace.
    result = subprocess.run(
        [sys.executable, str(MODULE), str(args_file)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(COLLECTIONS), **(env or {})),
        check=False,
    )
    return json.loads(result.stdout)


def test_module_reads_the_standin(tmp_path):
    fixture = FIXTURES / "h100-8.json"
    out = run_module({"nvidia_smi_path": str(STANDIN)}, tmp_path, {"NVIDIA_SMI_STANDIN": str(fixture)})
    gpus, processes = expected_facts(fixture)
    assert not out.get("failed") and out["changed"] is False and out["source"] == "nvidia-smi"
    assert out["ansible_facts"] == {"nvidia_gpus": gpus, "nvidia_gpu_processes": processes}


def test_module_without_process_query(tmp_path):
    out = run_module(
        {"nvidia_smi_path": str(STANDIN), "query_processes": False},
        tmp_path,
        {"NVIDIA_SMI_STANDIN": str(FIXTURES / "h100-8.json")},
    )
    assert out["ansible_facts"]["nvidia_gpu_processes"] == []


def test_module_driver_not_loaded(tmp_path):
    out = run_module(
        {"nvidia_smi_path": str(STANDIN)}, tmp_path, {"NVIDIA_SMI_STANDIN": str(FIXTURES / "driver-not-loaded.json")}
    )
    assert out["failed"] is True and out["rc"] == 9
    assert DRIVER_NOT_LOADED in out["msg"] and "exit code 9" in out["msg"]


def test_module_missing_nvidia_smi(tmp_path):
    out = run_module({"nvidia_smi_path": str(tmp_path / "no-such-nvidia-smi")}, tmp_path)
    assert out["failed"] is True
    assert "driver is not installed" in out["msg"] and "nvidia_gpu_install_driver" in out["msg"]
    out = run_module({"nvidia_smi_path": "nvidia-smi-that-does-not-exist"}, tmp_path)
    assert out["failed"] is True and "driver is not installed" in out["msg"]


def test_module_leaves_declared_gpus_to_the_action(tmp_path):
    """The module only queries nvidia-smi; declared GPUs never reach the host."""
    out = run_module({"declared": [{"name": "x"}]}, tmp_path)
    assert out["failed"] is True and "read on the controller by the action" in out["msg"]


def test_action_and_module_report_the_same_keys():
    assert action.GPU_KEYS == m.GPU_KEYS and action.MIG_MODES == m.MIG_MODES


def test_count_message_names_the_host_and_the_gpus():
    gpus = action.normalize_declared([{"name": "NVIDIA A10G", "memory_total_mib": 23028, "compute_capability": "8.6",
                                       "count": 3}])
    assert action.count_message("gpu-1", gpus, 0) is None and action.count_message("gpu-1", gpus, 3) is None
    assert action.count_message("gpu-1", gpus, 4) == (
        "gpu-1 has 3 GPU(s), nvidia_gpu_expected_count is 4: NVIDIA A10G, NVIDIA A10G, NVIDIA A10G.")
    assert action.count_message("gpu-1", [], 1) == "gpu-1 has 0 GPU(s), nvidia_gpu_expected_count is 1: none."


# --- role variables --------------------------------------------------------------------------------------------


def test_argument_specs_match_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert all(name.startswith("nvidia_gpu_") for name in defaults)
    main = specs["main"]["options"]
    assert set(main) == set(defaults)
    for name, spec in main.items():
        assert spec.get("default") == defaults[name], name
    for name, spec in specs["facts"]["options"].items():
        assert spec == {**main[name], "description": spec["description"]}, name


# A host described by its hardware only: the driver version is the loaded module's, as on a real host.
HARDWARE_ONLY = {"gpus": [{"index": 0, "name": "NVIDIA A10G", "uuid": "GPU-5e8f3f2a-2b8e-4c2e-9a43-0c1e6a7b9d01",
                           "memory_total_mib": 23028, "memory_used_mib": 0, "compute_capability": "8.6",
                           "mig_mode": None, "minor_number": 0}]}
QUERY = ["--query-gpu=" + ",".join(m.GPU_QUERY_FIELDS), m.CSV_FORMAT]


def run_packaged_standin(tmp_path, loaded, library_version=None):
    """The stand-in as the driver scenario's packages install it: LIBRARY_VERSION set, the module in sysfs."""
    fixture = tmp_path / "host.json"
    fixture.write_text(json.dumps(HARDWARE_ONLY))
    standin = tmp_path / "nvidia-smi"
    text = STANDIN.read_text()
    if library_version:
        text = text.replace("\nLIBRARY_VERSION = None\n", "\nLIBRARY_VERSION = %r\n" % library_version)
    standin.write_text(text)
    standin.chmod(0o755)
    sysfs = tmp_path / "sys"
    if loaded:
        (sysfs / "module" / "nvidia").mkdir(parents=True)
        (sysfs / "module" / "nvidia" / "version").write_text(loaded + "\n")
    env = dict(os.environ, NVIDIA_SMI_STANDIN=str(fixture), NVIDIA_SMI_STANDIN_SYSFS=str(sysfs))
    return subprocess.run([str(standin)] + QUERY, capture_output=True, text=True, env=env, check=False)


def test_standin_reports_the_loaded_module_version(tmp_path):
    out = run_packaged_standin(tmp_path, loaded="550.144.03", library_version="550.144.03")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "0, NVIDIA A10G, GPU-5e8f3f2a-2b8e-4c2e-9a43-0c1e6a7b9d01, 23028, 0, 550.144.03, 8.6, [N/A], 0\n"
    assert m.parse_gpu_csv(out.stdout)[0]["driver_version"] == "550.144.03"


def test_standin_without_a_loaded_module_fails_like_nvidia_smi(tmp_path):
    out = run_packaged_standin(tmp_path, loaded=None, library_version="550.144.03")
    assert out.returncode == 9 and out.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")


def test_standin_after_an_upgrade_without_reboot_reports_the_mismatch(tmp_path):
    out = run_packaged_standin(tmp_path, loaded="550.127.08", library_version="550.144.03")
    assert out.returncode == 18
    assert out.stdout == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.144\n"
    assert "driver/library version mismatch" in m.RC_HINTS[18]


def test_an_8x_h200_host_is_planned_from_what_the_standin_prints(tmp_path):
    """End to end on realistic facts: the module reads the stand-in's 8 x H200 (143771 MiB each, as real H200
    hosts print), and the sizing filter plans a 235B FP8 MoE over all eight from those facts."""
    import vllm_sizing as vs  # filter_plugins, on the path from conftest

    out = run_module({"nvidia_smi_path": str(STANDIN)}, tmp_path,
                     {"NVIDIA_SMI_STANDIN": str(FIXTURES / "h200-8.json")})
    gpus = out["ansible_facts"]["nvidia_gpus"]
    assert [(g["name"], g["memory_total_mib"], g["compute_capability"]) for g in gpus] == \
        [("NVIDIA H200", 143771, "9.0")] * 8
    name = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"
    plan = vs.vllm_sizing(gpus, vs.vllm_model(name), {"p99_context": 32768, "peak_concurrency": 32},
                          {"model": name, "tensor_parallel_size": 8})
    assert plan["fits"], plan
    assert plan["engine_args"]["tensor_parallel_size"] == 8 and plan["engine_args"]["max_model_len"] >= 32768
