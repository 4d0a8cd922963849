"""vLLM (``vllm serve``, the V1 engine): PagedAttention (Kwon et al. 2023), continuous
batching with chunked prefill, preemption by recomputation when the KV cache runs out."""

from __future__ import annotations

from autoplan.descriptors.hardware import Device
from autoplan.descriptors.model import CSA, GDN, HCA, KDA, MIXERS, SPARSE, Model
from autoplan.serving.deployment import Deployment, SpecMethod
from autoplan.serving.engine import (
    SILICON_FIT,
    EngineDefaults,
    EngineSpec,
    EngineVersion,
    Fitted,
    HybridCache,
    StateReuse,
    mamba_only,
    register,
    release_version,
    uses_recurrent,
)
from autoplan.serving.versions import parse_version
from autoplan.units import GiB


def _batch_defaults(device: Device, memory_fraction: float) -> EngineDefaults:
    """``vllm serve``'s batch limits (read in vLLM 0.33.0's vllm/engine/arg_utils.py
    ``get_batch_defaults``): max_num_batched_tokens 16384 and max_num_seqs 1024 on GPUs of
    160 GiB or more, 8192 and 1024 on GPUs of 70 GiB or more that are not A100s, else 2048
    and 256; chunked prefill on. Admission on the prompt alone (the scheduler preempts when
    decoding runs out of blocks)."""
    if device.mem_bytes >= 160 * GiB:
        return EngineDefaults(1024, 16384, True, memory_fraction)
    if device.mem_bytes >= 70 * GiB and "a100" not in device.name.lower():
        return EngineDefaults(1024, 8192, True, memory_fraction)
    return EngineDefaults(256, 2048, True, memory_fraction)


def defaults(device: Device) -> EngineDefaults:
    """The newest line's defaults: :func:`_batch_defaults` with ``gpu_memory_utilization``
    0.92 of the whole GPU (vllm/config/cache.py, 0.33.0)."""
    return _batch_defaults(device, 0.92)


def defaults_0_9(device: Device) -> EngineDefaults:
    """Before 0.33: ``gpu_memory_utilization`` 0.9 (vllm/config/cache.py; the batch limits
    are 0.33's, not read release by release)."""
    return _batch_defaults(device, 0.9)


def async_scheduling_off(d: Deployment) -> str | None:
    """Where vLLM's async scheduling stays off although on by default (0.14.0 release notes:
    "excludes some not-yet-supported configurations: pipeline parallel, CPU backend,
    non-MTP/Eagle spec decoding")."""
    if d.pp > 1:
        return "pipeline parallel"
    if d.speculative is not None and d.speculative.method not in (SpecMethod.MTP, SpecMethod.EAGLE):
        return f"{d.speculative.method.value} speculative decoding"
    return None


# vLLM's release lines, oldest first: what each does by default, and where it is read
VERSIONS = (
    # 0.5.0: the V0 engine (its scheduler and model runner in one process, each step's host
    # work in series with the GPU's; CUDA graphs for decode batches up to 256,
    # vllm/config.py _BATCH_SIZES_TO_CAPTURE). No measured run of it is scored: its constants
    # and limits are those autoplan predicted every vLLM release with before the silicon fit
    # (the stand-in for a 2023-24 engine of unstated release, benchmarks/serving_accuracy.py),
    # the newest line's defaults included (V0's own gpu_memory_utilization was 0.9)
    EngineVersion(version="0.5.0", host_hidden=0.0, cuda_graphs=True, graph_max_batch=256,
                  source="vLLM 0.5.0 vllm/config.py (V0 engine)"),
    # 0.11.0 release notes: the V0 engine removed (V1 only); async scheduling opt-in
    # (--async-scheduling); CUDA graphs captured by default (CompilationConfig
    # cudagraph_mode FULL_AND_PIECEWISE: full graphs for decode batches up to
    # max_cudagraph_capture_size 512); gpu_memory_utilization 0.9
    EngineVersion(version="0.11.0", host_hidden=0.0, cuda_graphs=True, graph_max_batch=512,
                  defaults=defaults_0_9,
                  source="vLLM 0.11.0 release notes; vllm/config/compilation.py; vllm/config/cache.py"),
    # 0.14.0 release notes, Breaking Changes: "Async scheduling is now enabled by default"
    # (the scheduler prepares step n+1 while the GPU runs step n; vllm/v1/core/sched/
    # async_scheduler.py), but for pipeline parallel and non-MTP/EAGLE speculative decoding
    EngineVersion(version="0.14.0", host_hidden=1.0, overlap_off=async_scheduling_off, cuda_graphs=True,
                  graph_max_batch=512, defaults=defaults_0_9,
                  source="vLLM 0.14.0 release notes (github.com/vllm-project/vllm/releases/tag/v0.14.0)"),
    # 0.33.0: gpu_memory_utilization 0.92 (vllm/config/cache.py), the batch limits of
    # get_batch_defaults (vllm/engine/arg_utils.py); async scheduling as in 0.14
    EngineVersion(version="0.33.0", host_hidden=1.0, overlap_off=async_scheduling_off, cuda_graphs=True,
                  graph_max_batch=512, defaults=defaults,
                  source="vLLM 0.33.0 vllm/config/cache.py, vllm/engine/arg_utils.py"),
)

# The constants fitted per line (benchmarks/serving_fit.py). vLLM's are a prior until the
# silicon rows fit them: no row of serving_calibration.csv that autoplan scores ran on a
# stated vLLM (Lambda's state no lengths; Splitwise's does not state its engine). Set by hand
# as the host time an iteration shows (serial), so the lines' async scheduling is not
# applied to them again.
# Fitted on NVIDIA's measured closed loops (372 vLLM 0.11-0.19 runs, each simulated with its
# benchmark client's lengths): the host time shown in series with the GPU's work fitted better
# than async scheduling hiding it (serial); the front end 2.7 ms a request; eager (non-graph)
# iterations launch-bound at 60 us a kernel; docs/ACCURACY.md has the folds
_SILICON = Fitted(host_step_s=2.0e-3, kernel_scale=0.855, request_s=2.7e-3, launch_s=60e-6, serial=True,
                  source=SILICON_FIT)
FITTED = {"0.5.0": Fitted(host_step_s=2.0e-3, source="prior: not fitted (no measured V0 run scored)",
                          prior=True, serial=True),
          "0.11.0": _SILICON, "0.14.0": _SILICON, "0.33.0": _SILICON}


# -- models whose layers differ ---------------------------------------------------------
# The V1 engine's hybrid KV cache manager gives sliding-window layers only their window
# (``SlidingWindowSpec``; vLLM docs "Hybrid KV Cache Manager"; the RFC, issue #11382, and
# PR #13296: "only allocate block for kv cache of full attention layers and kv cache inside
# the sliding window", prefix caching kept); V0 kept every token for them (issue #6323:
# "vllm currently ignores local-attn and uses global-attn"). Releases from 0.10.0 are taken
# to have it (the manager landed in V1 during 0.9-0.10; the line after V0 here is 0.11.0).
WINDOWED_SINCE = parse_version("0.10.0")
# Prefix caching for models with recurrent layers:
# - before 0.11.1 disabled for every hybrid or Mamba model (vllm/model_executor/models/
#   config.py, MambaModelConfig: "Hybrid or mamba-based model detected: disabling prefix
#   caching since it is not yet supported");
# - PR #25752 "[V1] [Hybrid] Mamba2 Automatic Prefix Caching" (merged 2025-10-04, so in
#   0.11.1): a Mamba-2 state per block of a model that supports it (``mamba_cache_mode``
#   all); GDN's (PR #26807) never merged, so GDN/KDA models reuse nothing;
# - PR #30877 "[V1][Hybrid] Mamba Prefix Caching with align mode" (merged 2026-01-24, so in
#   0.15.0): every other recurrent model (GDN, KDA) keeps a state at the end of each
#   prefill step, steps scheduled in whole blocks (vllm/config/cache.py ``mamba_cache_mode``
#   align: "only cache the mamba state of the last token of each scheduler step and when the
#   token is at position i * block_size"; its checkpoints are floor(budget / block) x block
#   apart: PR #50172's description), so a prefix is reused in whole steps;
# - either way the KV block is sized so one layer's page holds a recurrent state
#   (HybridAttentionMambaModelConfig: 528 tokens for Qwen3.5-4B, issue #40696), and a
#   prefix is reused in whole such blocks. Prefix caching stays opt-in for these models
#   (--enable-prefix-caching: the launch writes it for a workload with a shared prefix).
MAMBA_BLOCKS_SINCE = parse_version("0.11.1")
ALIGN_SINCE = parse_version("0.15.0")


def hybrid_cache(release: str, model: Model) -> HybridCache:
    """What vLLM ``release`` does with ``model``'s sliding and recurrent layers (above)."""
    v = release_version(release)
    windowed = v >= WINDOWED_SINCE
    if not uses_recurrent(model):
        return HybridCache(windowed=windowed, source="vLLM hybrid KV cache manager (SlidingWindowSpec)")
    if v >= ALIGN_SINCE:
        mode = StateReuse.BLOCKS if mamba_only(model) else StateReuse.STEPS
        source = "vLLM PR #25752 (all) and #30877 (align); vllm/config/cache.py"
        return HybridCache(windowed, mode, True, source)
    if v >= MAMBA_BLOCKS_SINCE and mamba_only(model):
        return HybridCache(windowed, StateReuse.BLOCKS, True, "vLLM PR #25752 (Mamba2 prefix caching)")
    return HybridCache(windowed, StateReuse.NONE, True,
                       "vllm/model_executor/models/config.py MambaModelConfig (prefix caching disabled)")


# The first vLLM release that runs each new kind of layer: GDN with Qwen3-Next (vLLM blog
# 2025-09-11 "vLLM Now Supports Qwen3-Next", on nightly then; 0.10.2 the release after),
# DeepSeek sparse attention with DeepSeek-V3.2 (vLLM blog 2025-09-29; 0.11.0), KDA with
# Kimi Linear (released 2025-10-30, after 0.11.0: the release that added it is not pinned
# here, taken as 0.11.1), DeepSeek-V4's compressed layers (vLLM recipe for
# DeepSeek-V4-Flash: "vLLM 0.20.1+"; day 0, 2026-04-24, ran a dedicated image). Mamba-2
# hybrids and sliding windows ran before the lines here.
FIRST_RELEASE = {GDN: parse_version("0.10.2"), SPARSE: parse_version("0.11.0"), KDA: parse_version("0.11.1"),
                 CSA: parse_version("0.20.1"), HCA: parse_version("0.20.1")}


def family_refusals(release: str, model: Model) -> list[tuple[str, str]]:
    """(field, why) for a model with layers the release does not run (:data:`FIRST_RELEASE`)."""
    v = release_version(release)
    if v.nightly:
        return []
    out = [("model", f"{model.name} has {MIXERS[m]} layers ({m}), which vLLM runs from {first} on, "
                     f"not {release}: give engine: {{name: vllm, version: '{first}'}} or newer")
           for m, first in FIRST_RELEASE.items() if m in model.mixers and v < first]
    if model.attn_res_block:
        # Kimi-K3 (vllm/models/kimi_k3.py) is on main; no release is pinned here that runs it
        # (vllm-project/speculators PR 998, 2026-08: "use vLLM latest main")
        out.append(("model", f"{model.name} has attention residuals (Kimi-K3), which vLLM runs on "
                             f"its main branch, in no release pinned here: give engine: "
                             f"{{name: vllm, version: nightly}} or another engine"))
    return out


VLLM = register(EngineSpec(
    name="vllm", attr="VLLM", doc="vLLM's OpenAI-compatible server (vllm serve, V1 engine).",
    defaults=defaults, versions=VERSIONS, fitted=FITTED, hybrid_cache=hybrid_cache,
    model_refusals=family_refusals))
