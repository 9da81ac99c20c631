"""The release table (plugins/plugin_utils/vllm_sizing/releases.json): its rows resolve to the schema, agree with what
tools/vllm_release.py reads in every cached release's source, leave no cached release out, and the tool fails
with a clear message on a source shape it does not know."""
import os
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vllm_release  # noqa: E402
import vllm_source  # noqa: E402

ROWS = vllm_release.load_rows()
RESOLVED = vllm_release.resolve(ROWS)
CACHED = vllm_release.cached_versions()
FLAGS = vllm_source.read_flags(vllm_release.FLAGS_PY)
CC_GRID = list(vllm_source.CC_GRID)


@pytest.fixture(scope="module")
def source_facts():
    """Every cached release's facts, read once (in parallel, or from the tool's cache)."""
    return vllm_release.facts(CACHED)


# ----------------------------------------------------------------------------------------------- (1) the schema
def one_of(*values):
    return lambda v: v in values


def list_of(kind):
    return lambda v: isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool) for x in v)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def tier(entry):
    return (isinstance(entry, list) and len(entry) == 5 and is_int(entry[0])
            and (entry[1] is None or isinstance(entry[1], str)) and (entry[2] is None or entry[2] in CC_GRID)
            and is_int(entry[3]) and is_int(entry[4]))


def priority(value, backends):
    """Every cc of CC_GRID exactly once, every name a known backend."""
    ccs = [cc for ccs, _ in value for cc in ccs]
    return sorted(ccs, key=CC_GRID.index) == CC_GRID and all(
        names and all(n in backends for n in names) for _, names in value)


def backend(b):
    sizes_ok = list_of(int)(b["sizes"]) and b["sizes"] and (not b["multiple_of"] or len(b["sizes"]) == 1)
    by_cc = b.get("kv_dtypes_by_cc", {})
    return (set(b) <= {"runs_on", "sizes", "multiple_of", "kv_dtypes", "kv_dtypes_by_cc", "max_block"}
            and all(cc in CC_GRID for cc in b["runs_on"]) and sizes_ok and isinstance(b["multiple_of"], bool)
            and list_of(str)(b["kv_dtypes"]) and all(cc in CC_GRID and list_of(str)(d) for cc, d in by_cc.items())
            and is_int(b.get("max_block", 1)))


def forced(value):
    return value is None or all(cc in CC_GRID and set(entry) == {"qk_nope_128", "other"} and all(
        list_of(int)(e["keep"]) and (e["else"] is None or is_int(e["else"])) for e in entry.values())
        for cc, entry in value.items())


def cpu_record(r, with_forced):
    keys = {"backend", "default", "sizes", "multiple_of", "kv_dtypes"} | ({"forced"} if with_forced else set())
    return (set(r) == keys and isinstance(r["backend"], str) and is_int(r["default"]) and list_of(int)(r["sizes"])
            and isinstance(r["multiple_of"], bool) and list_of(str)(r["kv_dtypes"])
            and (not with_forced or r["forced"] is None or is_int(r["forced"])))


SCHEMA = {
    "block_size": is_int,
    "block_sizes": lambda v: v is None or list_of(int)(v),
    "kv_cache_dtypes": lambda v: list_of(str)(v) and "auto" in v,
    "kv_cache_dtype_parse": one_of("choices", "any"),
    "check": one_of("layers", "first-group-global", "first-group", "groups"),
    "null_block": one_of(True, False),
    "in_flight": one_of("batch", "batches-runner", "batches"),
    "sw_block": one_of("primary", "smallest", "largest-within", "largest-within-expanded", "dividing"),
    "message": one_of("models's", "model's"),
    "gib_format": one_of("%.2f", None),
    "utilization": lambda v: isinstance(v, float) and 0 < v <= 1,
    "extensible_kv_cache": one_of(True, False),
    "async_scheduling": lambda v: set(v) == {"default", "off_with_pp"} and v["default"] in (True, False)
    and v["off_with_pp"] in ("never", "always", "v1-runner"),
    "batch_defaults": lambda v: v and all(tier(t) for t in v) and v[-1][0] == 0,
    "cpu_batch_defaults": lambda v: list_of(int)(v) and len(v) == 2,
    "absent_flags": lambda v: list_of(str)(v) and v == sorted(v) and set(v) <= set(FLAGS),
    "negative_flags": lambda v: all(FLAGS.get(k, {}).get("kind") == "bool" and s.startswith("--")
                                    for k, s in v.items()),
    "choices": lambda v: all(k in FLAGS and isinstance(c, list) and c for k, c in v.items()),
    "requested": one_of("product", "ceil"),
    "sampler": lambda v: set(v) == {"flashinfer", "native"} and v["flashinfer"] in ("default", "if-installed", "opt-in")
    and v["native"] in ("sort", "triton"),
    "sampler_v2": one_of("plain", "warmup", None),
    "moe_chunk": lambda v: v is None or is_int(v),
    "non_torch": one_of("snapshot", "snapshot-graphs", "consumed"),
    "cuda_graph_estimate": lambda v: set(v) == {"v1", "v2"} and all(x in (True, False) for x in v.values()),
    "runner_v2": lambda v: set(v) == {"rule", "archs", "quantized", "hybrid_listed", "moe"}
    and v["rule"] in ("never", "listed", "listed-or-dense", "all", "only") and list_of(str)(v["archs"])
    and v["archs"] == sorted(v["archs"]) and all(v[k] in (True, False) for k in ("quantized", "hybrid_listed", "moe")),
    "startup_plan": lambda v: v is None or is_int(v),
    "load_formats": lambda v: list_of(str)(v) and v == sorted(v) and "auto" in v,
    "block_rule": one_of("forced", "preferred"),
    "cuda": lambda v: set(v) == {"standard", "mla", "backends", "forced_mla"} and all(
        backend(b) for b in v["backends"].values()) and priority(v["standard"], v["backends"])
    and priority(v["mla"], v["backends"]) and forced(v["forced_mla"]),
    "cpu": lambda v: set(v) == {"standard", "mla"} and cpu_record(v["standard"], False) and (
        v["mla"] is None or (set(v["mla"]) == {"amx", "no_amx"} and cpu_record(v["mla"]["no_amx"], True)
                             and (v["mla"]["amx"] is None or cpu_record(v["mla"]["amx"], False)))),
}


def test_table_starts_with_a_full_row_in_version_order():
    versions = list(ROWS)
    assert versions and versions == sorted(versions, key=vllm_release.key)
    assert set(ROWS[versions[0]]) == set(SCHEMA)
    assert all(set(row) <= set(SCHEMA) for row in ROWS.values())


@pytest.mark.parametrize("version", list(RESOLVED))
def test_resolved_row_has_every_key_with_a_valid_value(version):
    row = RESOLVED[version]
    assert set(row) == set(SCHEMA)
    bad = [k for k, valid in SCHEMA.items() if not valid(row[k])]
    assert not bad, "vLLM %s: invalid %s" % (version, ", ".join(bad))
    assert (row["cuda"]["forced_mla"] is None) == (row["block_rule"] == "preferred")


def test_deltas_are_minimal():
    """Each row gives only what changed: writing the resolved rows again gives the same table."""
    assert vllm_release.deltas(RESOLVED) == ROWS


# ----------------------------------------------------------------------------------------------- (2) the source
@pytest.mark.parametrize("version", list(RESOLVED))
def test_row_matches_the_release_source(version, source_facts):
    if version not in CACHED:
        pytest.skip("no source of vLLM %s in %s: tools/vllm_release.py fetch %s"
                    % (version, vllm_release.cache_root(), version))
    differences = vllm_release.diff("", RESOLVED[version], source_facts[version], [])
    assert not differences, "vLLM %s: table and source differ (run tools/vllm_release.py add %s): %s" % (
        version, version, differences)


# ----------------------------------------------------------------------------------------------- (3) no gap
def test_table_holds_every_cached_release():
    missing = [v for v in CACHED if v not in ROWS]
    assert not missing, "cached but not in releases.json: tools/vllm_release.py add %s" % " ".join(missing)


# ----------------------------------------------------------------------------------------------- (4) unknown shapes
def write(root, rel, text):
    path = root / "vllm" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


SLIDING = """
    class SlidingWindowSpec:
        def max_admission_blocks_per_request(self, max_in_flight_tokens, max_model_len):
            num_tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
            return cdiv(num_tokens, self.block_size) + 1
"""


def test_new_in_flight_rule_fails_with_where_and_what(tmp_path):
    write(tmp_path, "v1/kv_cache_interface.py", SLIDING)
    write(tmp_path, "config/vllm.py", """
        class VllmConfig:
            @property
            def max_in_flight_tokens(self):
                return self.max_concurrent_batches * self.scheduler_config.max_num_batched_tokens

            @property
            def max_concurrent_batches(self):
                return self.parallel_config.pipeline_parallel_size + 2
    """)
    release = vllm_source.Release(str(tmp_path), "9.9.0")
    with pytest.raises(vllm_source.ShapeError, match=r"^vLLM 9\.9\.0: vllm/config/vllm\.py "
                       r"VllmConfig\.max_concurrent_batches: expected one of the known rules"):
        vllm_source.in_flight(release)


def test_new_condition_in_a_cut_out_function_names_it(tmp_path):
    """A stub meets an attribute it was not written for: the release, file, function and attribute are named."""
    write(tmp_path, "v1/kv_cache_interface.py", SLIDING)
    write(tmp_path, "config/vllm.py", """
        class VllmConfig:
            @property
            def max_in_flight_tokens(self):
                return self.max_concurrent_batches * self.scheduler_config.max_num_batched_tokens

            @property
            def max_concurrent_batches(self):
                if self.scheduler_config.stream_overlap:
                    return 3
                return self.parallel_config.pipeline_parallel_size
    """)
    release = vllm_source.Release(str(tmp_path), "9.9.0")
    with pytest.raises(vllm_source.ShapeError, match=r"vLLM 9\.9\.0: vllm/config/vllm\.py VllmConfig\."
                       r"max_concurrent_batches: .*'stream_overlap'"):
        vllm_source.in_flight(release)


def test_unknown_tier_condition_fails(tmp_path):
    write(tmp_path, "engine/arg_utils.py", """
        class EngineArgs:
            def get_batch_defaults(cls, world_size):
                if device_memory >= 70 * GiB_bytes and current_platform.is_fast():
                    default_max_num_batched_tokens = {UsageContext.OPENAI_API_SERVER: 8192}
                    default_max_num_seqs = {UsageContext.OPENAI_API_SERVER: 1024}
                else:
                    default_max_num_batched_tokens = {UsageContext.OPENAI_API_SERVER: 2048}
                    default_max_num_seqs = {UsageContext.OPENAI_API_SERVER: 256}
    """)
    release = vllm_source.Release(str(tmp_path), "9.9.0")
    with pytest.raises(vllm_source.ShapeError, match=r"vllm/engine/arg_utils\.py EngineArgs\.get_batch_defaults: "
                       r"expected tier conditions .* got current_platform\.is_fast\(\)"):
        vllm_source.batch_defaults(release)


SW_HELPER = """
    def _largest_kernel_block_within(attn_backend, per_token_bytes, page_budget, fallback):
        from vllm.v1.attention.backend import MultipleOf
        sizes = attn_backend.get_supported_kernel_block_sizes()
        candidates = [s for s in sizes if isinstance(s, int)]
        if not candidates:
            candidates = [s.base for s in sizes if isinstance(s, MultipleOf)]
        if not candidates:
            return fallback
        fitting = [b for b in candidates if b * per_token_bytes <= page_budget]
        return max(fitting) if fitting else min(candidates)
"""


def sw_layer(choice):
    return SW_HELPER + """

    class Attention:
        def get_kv_cache_spec(self, vllm_config):
            block_size = vllm_config.cache_config.block_size
            assert self.attn_type == AttentionType.DECODER
            if self.sliding_window is not None:
                shared_page = vllm_config.cache_config.skip_page_size_padded
                sw_per_token = self.attn_backend.customize_spec(SlidingWindowSpec(
                    block_size=1, num_kv_heads=self.num_kv_heads, head_size=self.head_size,
                    dtype=self.kv_cache_torch_dtype, sliding_window=self.sliding_window)).real_page_size_bytes
                page_budget = shared_page or sw_per_token * block_size
                sw_block_size = %s
                return SlidingWindowSpec(block_size=sw_block_size, num_kv_heads=self.num_kv_heads,
                                         head_size=self.head_size, dtype=self.kv_cache_torch_dtype,
                                         sliding_window=self.sliding_window, page_size_padded=shared_page)
            return FullAttentionSpec(block_size=block_size, num_kv_heads=self.num_kv_heads,
                                     head_size=self.head_size, dtype=self.kv_cache_torch_dtype)
    """ % choice


def test_sw_block_rules_are_told_apart_by_the_probes():
    results = {name: [rule(*probe) for probe in vllm_source.SW_PROBES]
               for name, rule in vllm_source.SW_RULES.items()}
    assert len({tuple(r) for r in results.values()}) == len(results)


def test_sw_block_reads_a_rule_from_the_layer_source(tmp_path):
    """The page budget of the shared page or the primary block's page, the largest base that fits."""
    write(tmp_path, "model_executor/layers/attention/attention.py",
          sw_layer("_largest_kernel_block_within(self.attn_backend, sw_per_token, page_budget, block_size)"))
    write(tmp_path, "config/cache.py", """
        class CacheConfig:
            skip_page_size_padded: int | None = None
    """)
    release = vllm_source.Release(str(tmp_path), "9.9.0")
    assert vllm_source.sw_block(release) == "largest-within"


def test_new_sw_block_rule_fails_with_where_and_what(tmp_path):
    write(tmp_path, "model_executor/layers/attention/attention.py", sw_layer("2 * block_size"))
    write(tmp_path, "config/cache.py", """
        class CacheConfig:
            skip_page_size_padded: int | None = None
    """)
    release = vllm_source.Release(str(tmp_path), "9.9.0")
    with pytest.raises(vllm_source.ShapeError, match=r"^vLLM 9\.9\.0: vllm/model_executor/layers/attention/"
                       r"attention\.py Attention\.get_kv_cache_spec: expected the sliding-window block size "
                       r"chosen by one of the known rules \(primary, smallest, largest-within, "
                       r"largest-within-expanded, dividing"):
        vllm_source.sw_block(release)


def test_sw_block_without_the_layer_method_or_runner_spec_fails(tmp_path):
    write(tmp_path, "attention/layer.py", """
        class Attention:
            def forward(self, query, key, value):
                return query
    """)
    release = vllm_source.Release(str(tmp_path), "9.9.0")
    with pytest.raises(vllm_source.ShapeError, match=r"Attention\.get_kv_cache_spec: expected the method that "
                       r"builds the sliding-window KV spec"):
        vllm_source.sw_block(release)


def test_check_names_the_nested_key_that_differs():
    table = {"cuda": {"backends": {"FLASH_ATTN": {"sizes": [16]}}}, "block_size": 16}
    source = {"cuda": {"backends": {"FLASH_ATTN": {"sizes": [32]}}}, "block_size": 16}
    assert vllm_release.diff("", table, source, []) == [("cuda.backends.FLASH_ATTN.sizes", [16], [32])]
