"""TensorRT-LLM (``trtllm-serve``, the PyTorch backend): in-flight batching with the
capacity scheduler's GUARANTEED_NO_EVICT admission by default."""

from __future__ import annotations

from autoplan.descriptors.hardware import Device
from autoplan.descriptors.model import CSA, GDN, HCA, KDA, MAMBA, MIXERS, SPARSE, Model
from autoplan.serving.engine import (
    SILICON_FIT,
    EngineDefaults,
    EngineSpec,
    EngineVersion,
    Fitted,
    HybridCache,
    StateReuse,
    register,
    release_version,
    uses_recurrent,
)
from autoplan.serving.versions import parse_version


def defaults(device: Device) -> EngineDefaults:
    """``trtllm-serve``'s defaults: ``max_batch_size`` 2048, ``max_num_tokens`` 8192,
    ``kv_cache_config.free_gpu_memory_fraction`` 0.9 of the memory free after the weights
    (TensorRT-LLM docs, "trtllm-serve" and "KV cache" pages); the capacity scheduler's
    default policy GUARANTEED_NO_EVICT admits a request only when its whole output fits
    ("Scheduler" in the TensorRT-LLM docs). Chunked prefill is autoplan's choice, not the
    engine's default (``enable_chunked_prefill`` defaults to False in
    tensorrt_llm/llmapi/llm_args.py): without it a prompt as long as ``max_num_tokens``
    never fits beside running decodes, so the exports write ``enable_chunked_prefill``
    explicitly (``side_files`` in autoplan/export/engines/trtllm.py) and the launch runs as
    predicted."""
    return EngineDefaults(2048, 8192, True, 0.9, memory_of_free=True, reserve_output=1.0)


# TensorRT-LLM's release lines, oldest first: what each does by default, and where it is read
VERSIONS = (
    # 0.5.0: TensorRT engines built by trtllm-build, run by the C++ runtime (batch manager,
    # in-flight batching); no overlap of scheduling with the GPU; CUDA graphs off
    # (ExtendedRuntimePerfKnobConfig cuda_graph_mode false)
    EngineVersion(version="0.5.0", host_hidden=0.0, cuda_graphs=False,
                  source="TensorRT-LLM 0.5-0.16 release notes; executor ExtendedRuntimePerfKnobConfig"),
    # 0.17.0: trtllm-serve (the launch scripts' command) with the PyTorch backend available
    # ("The PyTorch backend of TensorRT-LLM is available in version 0.17 and later",
    # experimental: the TensorRT engine stays the default; PyTorchConfig
    # enable_overlap_scheduler false in 0.18)
    EngineVersion(version="0.17.0", host_hidden=0.0, cuda_graphs=False,
                  source="TensorRT-LLM docs 0.18.2, PyTorch Backend"),
    # 1.0: the PyTorch backend by default; its overlap scheduler on ("Enabled by default. To
    # disable, set disable_overlap_scheduler=True": docs, Overlap Scheduler; the CPU work of
    # step n runs while the GPU computes step n+1); CUDA graphs for decode-only batches
    # (llm_args.py cuda_graph_config default_factory=CudaGraphConfig, max_batch_size 128
    # where none is given)
    EngineVersion(version="1.0.0rc0", host_hidden=1.0, cuda_graphs=True, graph_max_batch=128,
                  source="TensorRT-LLM docs: Overlap Scheduler; tensorrt_llm/llmapi/llm_args.py"),
)

# The constants fitted per line (benchmarks/serving_fit.py): fitted on serving_calibration.csv's
# TensorRT-LLM rows (v0.5 first-token latencies, v0.6.1 static batches, v0.17 offline
# throughput), each source weighing the same (leave-one-source-out error in docs/ACCURACY.md).
# Those rows ran without the overlap scheduler: the 1.x lines take these constants and hide
# the host time behind the GPU's until a fit of their own.
FITTED = {
    "0.17.0": Fitted(host_step_s=2.98e-3, host_seq_s=1.71e-6, kernel_scale=1.019,
                     source="serving_calibration.csv TensorRT-LLM v0.5-v0.17 rows "
                            "(python benchmarks/serving_fit.py)"),
    # NVIDIA's measured closed loops (526 TensorRT-LLM 1.0-1.3 runs, each simulated with its
    # benchmark client's lengths): the host time shown in series with the GPU's work fitted
    # better than the overlap scheduler hiding it (serial); the front end 4.5 ms a request;
    # eager iterations launch-bound at 30 us a kernel; docs/ACCURACY.md has the folds
    "1.0.0rc0": Fitted(host_step_s=2.0e-3, host_seq_s=1.71e-6, kernel_scale=0.945, request_s=4.5e-3,
                       launch_s=30e-6, serial=True, source=SILICON_FIT),
}


# -- models whose layers differ ---------------------------------------------------------
# Sliding-window layers: the KV cache manager keeps a pool per attention window
# (KvCacheConfig.max_attention_window, "variable sliding window attention"), in the PyTorch
# backend's lines here (1.0 on); the 0.x TensorRT-engine lines are taken to hold every token.
# Recurrent layers: block reuse for Mamba hybrids came with PR #12185 "[TRTLLM-10061][feat]
# Prefix caching support for mamba hybrid models" (merged 2026-04; issue #11533, filed
# 2026-02, had "prefix caching ... missing" for hybrid models): states snapshotted at
# intervals (``mamba_state_cache_interval``) and the prompt's end; taken from 1.3.0 (the rc
# that first carried it is not pinned), reused in whole KV blocks (the interval's default is
# not read here: an assumption). Before it nothing is reused.
WINDOWED_SINCE = parse_version("1.0.0rc0")
STATE_REUSE_SINCE = parse_version("1.3.0")
# The first release whose PyTorch backend runs each kind: Qwen3-Next's GDN and DeepSeek-V3.2's
# sparse attention by 1.2.0 (its release notes: "beta support for ... Qwen3-Next", "improved
# ... DeepSeek v3.2"), Kimi Linear's KDA taken from 1.3.0 (issue #11533: "NemotronH, Qwen3-Next
# and Kimi Linear are all supported", 2026-08), Nemotron-H's Mamba-2 from 1.0 (the PyTorch
# backend's NemotronHForCausalLM; its first release not pinned)
FIRST_RELEASE = {GDN: parse_version("1.2.0"), SPARSE: parse_version("1.2.0"), KDA: parse_version("1.3.0"),
                 MAMBA: parse_version("1.0.0rc0"),
                 # DeepSeek-V4: AIConfigurator's DeepSeek-V4 module tables were taken on
                 # 1.3.0rc23 (systems/data/b200_sxm/sparse_attention/trtllm/1.3.0rc23)
                 CSA: parse_version("1.3.0rc23"), HCA: parse_version("1.3.0rc23")}


def hybrid_cache(release: str, model: Model) -> HybridCache:
    """What TensorRT-LLM ``release`` does with ``model``'s sliding and recurrent layers (above)."""
    v = release_version(release)
    reuse = StateReuse.BLOCKS if v >= STATE_REUSE_SINCE and uses_recurrent(model) else StateReuse.NONE
    return HybridCache(v >= WINDOWED_SINCE, reuse, False,
                       "TensorRT-LLM KvCacheConfig.max_attention_window; PR #12185 (mamba block reuse)")


def family_refusals(release: str, model: Model) -> list[tuple[str, str]]:
    v = release_version(release)
    if v.nightly:
        return []
    out = [("model", f"{model.name} has {MIXERS[m]} layers ({m}), which TensorRT-LLM's PyTorch backend "
                     f"runs from {first} on, not {release}: give engine: {{name: trtllm, version: "
                     f"'{first}'}} or newer, or another engine")
           for m, first in FIRST_RELEASE.items() if m in model.mixers and v < first]
    if model.attn_res_block and v < ATTN_RES_SINCE:
        out.append(("model", f"{model.name} has attention residuals (Kimi-K3), which TensorRT-LLM runs "
                             f"from {ATTN_RES_SINCE} on, not {release}: give engine: {{name: trtllm, "
                             f"version: '{ATTN_RES_SINCE}'}} or newer, or another engine"))
    return out


# Kimi-K3: its deployment guide ("Kimi K3 on TensorRT LLM - Blackwell") is in the docs of
# 1.3.0rc26 (none earlier was found)
ATTN_RES_SINCE = parse_version("1.3.0rc26")


TRTLLM = register(EngineSpec(
    name="trtllm", attr="TRTLLM", doc="TensorRT-LLM's server (trtllm-serve, PyTorch backend).",
    defaults=defaults, versions=VERSIONS, fitted=FITTED,
    kv_block_tokens=32,  # KvCacheConfig.tokens_per_block (LLM API reference)
    hybrid_cache=hybrid_cache, model_refusals=family_refusals))
