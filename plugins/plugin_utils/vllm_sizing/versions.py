# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What changes between vLLM releases: the release table, one row per release published on PyPI since 0.11.0.

The rows live in releases.json next to this file. They are written by tools/vllm_release.py, which reads each
release's own Python source (the CLI parser, the config defaults, the KV startup check, the memory profiling, the
attention backends), and reviewed like code; tests/unit/test_vllm_releases.py compares them with the tool's output
wherever the source is in the cache. Each row gives only what changed since the release before it; VERSIONS holds
the resolved rows. The keys and what each value means: docs/releases.md. Adding a release: run
`tools/vllm_release.py add X.Y.Z`, review the diff, commit.
"""

import json
import os
import re

from .common import fail

TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "releases.json")
# The release the roles install when the inventory does not say (the vllm role's vllm_version).
PINNED_VERSION = "0.34.0"
# Compute capabilities of NVIDIA GPUs the table knows; facts that depend on the GPU are given for each.
CC_GRID = ("7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1")
AMX_FLAG = "amx_tile"  # /proc/cpuinfo; vLLM asks torch.cpu._is_amx_tile_supported()
ADD_COMMAND = "tools/vllm_release.py add %s"


def version_key(version):
    return tuple(int(part) for part in version.split("."))


def _resolved(rows):
    """Full rows from the table's deltas, in release order."""
    out, current = {}, {}
    for version in sorted(rows, key=version_key):
        current = dict(current, **rows[version])
        out[version] = current
    return out


def _load():
    with open(TABLE_FILE) as handle:
        return _resolved(json.load(handle)["rows"])


VERSIONS = _load()
OLDEST = min(VERSIONS, key=version_key)
NEWEST = max(VERSIONS, key=version_key)


def resolve_version(vllm_version):
    """The table's release for vllm_version (None: the pinned one). A release the table lacks is refused: its
    facts are unknown until the tool has read its source (a patch release differs from its minor release often
    enough: 0.11.1 changed the sampler, the block sizes and the KV dtypes of 0.11.0)."""
    version = PINNED_VERSION if vllm_version is None else str(vllm_version)
    # A local version label (the CPU build's "0.32.0+cpu") is the same release.
    version = version.split("+", 1)[0]
    if version in VERSIONS:
        return version
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        fail("vllm_version %r is not a vLLM release (X.Y.Z); the release table holds %s to %s"
             % (vllm_version, OLDEST, NEWEST))
    if version_key(version) > version_key(NEWEST):
        fail("vllm_version %s is newer than the release table, whose newest release is %s: add it with `%s` "
             "(it reads the release's source from PyPI), review the row and commit releases.json"
             % (version, NEWEST, ADD_COMMAND % version))
    if version_key(version) < version_key(OLDEST):
        fail("vllm_version %s is older than %s, the oldest release the table holds (the V1 engine's sizing); "
             "pin %s or later" % (version, OLDEST, OLDEST))
    fail("vllm_version %s is not in the release table (%s to %s, every release on PyPI): if it was published "
         "since, add it with `%s`" % (version, OLDEST, NEWEST, ADD_COMMAND % version))


def model_runner(row, shape):
    """v2 when the release runs this model on its V2 model runner by default, else v1 (vllm/config/vllm.py
    use_v2_model_runner). The choice moves what the profile run holds, whether the CUDA-graph estimate is taken and
    the sliding windows' in-flight tokens."""
    rule = row["runner_v2"]
    moe = bool(shape["dims"]["moe_layers"])
    listed = any(arch in rule["archs"] for arch in shape["architectures"])
    if rule["rule"] == "never":
        return "v1"
    if rule["rule"] in ("all", "only"):
        return "v2"
    if rule["rule"] == "listed":
        return "v2" if listed and (rule["moe"] or not moe) and (rule["quantized"] or not shape["quantization"]) \
            else "v1"
    return "v2" if listed or not moe else "v1"  # listed-or-dense


def async_scheduling(row, pp, runner, cpu):
    """Whether the release schedules asynchronously by default: never on the CPU platform, and PP > 1 can turn it
    off (row's async_scheduling.off_with_pp)."""
    rule = row["async_scheduling"]
    if cpu or not rule["default"]:
        return False
    if pp > 1 and (rule["off_with_pp"] == "always" or (rule["off_with_pp"] == "v1-runner" and runner == "v1")):
        return False
    return True


def in_flight_batches(row, pp, runner, async_on):
    """How many batches of max_num_batched_tokens a sliding-window layer keeps beyond its window."""
    if row["in_flight"] == "batch":
        return 1
    if not async_on:
        return pp
    if row["in_flight"] == "batches-runner" and runner == "v1":
        return 2 if pp <= 1 else pp
    return pp + 1
