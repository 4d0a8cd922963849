"""SGLang (``python -m sglang.launch_server``): RadixAttention, continuous batching with
chunked prefill, admission against the output its new_token_ratio expects."""

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
)
from autoplan.serving.versions import parse_version
from autoplan.units import GiB


def defaults(device: Device) -> EngineDefaults:
    """``sglang.launch_server``'s defaults: ``chunked_prefill_size`` 8192 on 80-160 GB GPUs,
    4096 below 60 GB (server_args.py); running requests bounded by the KV pool
    (``max_running_requests`` unset; 4096 here, beyond any pool these GPUs hold);
    ``mem_fraction_static`` about 0.88 on 80 GB GPUs at TP 4-8. The scheduler admits against
    the tokens its ``new_token_ratio`` expects the running requests to add
    (``init_new_token_ratio`` 0.7 of max_new_tokens)."""
    return EngineDefaults(4096, 8192 if device.mem_bytes >= 60 * GiB else 4096, True, 0.88,
                          reserve_output=0.7)


# SGLang's release lines, oldest first: what each does by default, and where it is read
VERSIONS = (
    # 0.4.0 (LMSYS blog 2024-12-04, "SGLang v0.4: zero-overhead batch scheduler"): the
    # overlap scheduler on by default, the CPU scheduling batch n+1 while the GPU runs
    # batch n (--disable-overlap-schedule turns it off); decode batches replay CUDA graphs
    # (cuda_graph_max_bs in server_args.py, 160 or more on 80 GB GPUs); prefill runs eager.
    # Its scheduler runs a new prefill batch alone before the running batch decodes
    # (sglang/srt/managers/scheduler.py ``get_next_batch_to_run``; mixed batches only with
    # --enable-mixed-chunk): prefill_first
    EngineVersion(version="0.4.0", host_hidden=1.0, cuda_graphs=True, graph_max_batch=160,
                  prefill_first=True,
                  source="LMSYS blog 2024-12-04 (SGLang v0.4); sglang/srt/server_args.py"),
    # 0.5.23: attention data parallelism as --attn-dp-size (deprecating --dp-size N
    # --enable-dp-attention, which the launch scripts write before it: ``args`` in
    # autoplan/export/engines/sglang.py)
    EngineVersion(version="0.5.23", host_hidden=1.0, cuda_graphs=True, graph_max_batch=160,
                  prefill_first=True, source="sglang/srt/server_args.py (0.5.23: --attn-dp-size)"),
)

# The constants fitted per line (benchmarks/serving_fit.py). A prior until the silicon rows
# fit them: no SGLang row in serving_calibration.csv. Set by hand as the host time an
# iteration shows (serial): the overlap scheduler is not applied to them again.
# Fitted on NVIDIA's measured closed loops (152 SGLang 0.5.x runs, each simulated with its
# benchmark client's lengths): 6 ms of host time an iteration, hidden by the overlap scheduler
# as SGLang documents it (not serial: the first fit with the clients' lengths where the
# overlap won); the front end 6.75 ms a request; eager iterations launch-bound at 20 us a
# kernel; docs/ACCURACY.md has the folds
_SILICON = Fitted(host_step_s=6.0e-3, kernel_scale=1.05, request_s=6.75e-3, launch_s=20e-6, serial=False,
                  source=SILICON_FIT)
FITTED = {"0.4.0": _SILICON, "0.5.23": _SILICON}


# -- models whose layers differ ---------------------------------------------------------
# Sliding-window layers keep their window in a pool of their own (sglang/srt/mem_cache/
# swa_memory_pool.py SWAKVPool, --swa-full-tokens-ratio; SWARadixCache frees tokens that left
# the window and keeps prefix caching), from the 0.5 releases that serve gpt-oss; 0.4's line
# held every token for them. Recurrent layers' states sit in MambaRadixCache
# (sglang/srt/mem_cache/mamba_radix_cache.py): a tree node holds a state only where an
# inserted sequence ended (nodes split off inside a prefix are "mamba tombstones" without
# one), and matching stops at the deepest node with a state; under the default
# --mamba-scheduler-strategy no_buffer (server_args.py) no state is kept inside a prompt, so
# a prefix shared by prompts that differ after it is computed again: nothing reused.
WINDOWED_SINCE = parse_version("0.5.0")
# the new kinds of layer came to SGLang in its 0.5 releases (Qwen3-Next and DeepSeek-V3.2 in
# 2025-09, Kimi Linear in 2025-10, after 0.4's line): the release that added each is not
# pinned here; 0.4.x runs none of them
FIRST_RELEASE = {m: parse_version("0.5.0") for m in (GDN, KDA, MAMBA, SPARSE)}
# DeepSeek-V4 (sgl-project/sglang PR 23600, day 0 on dedicated images): the release tag
# v0.5.12 loads it (InferenceX's KLAUD_DEBUG.md: DeepSeek-V4-Pro on v0.5.12-cu130)
FIRST_RELEASE.update({CSA: parse_version("0.5.12"), HCA: parse_version("0.5.12")})
# Kimi-K3's attention residuals and latent experts (sglang models/kimi_k3.py,
# layers/attn_residual.py): in 0.5.17 (aws/deep-learning-containers PR 6573, "SGLang 0.5.14
# -> 0.5.17, Kimi-K3 support")
ATTN_RES_SINCE = parse_version("0.5.17")


def hybrid_cache(release: str, model: Model) -> HybridCache:
    """What SGLang ``release`` does with ``model``'s sliding and recurrent layers (above)."""
    windowed = release_version(release) >= WINDOWED_SINCE
    source = "sglang/srt/mem_cache/swa_memory_pool.py; mamba_radix_cache.py (no_buffer)"
    return HybridCache(windowed, StateReuse.NONE, False, source)


def family_refusals(release: str, model: Model) -> list[tuple[str, str]]:
    v = release_version(release)
    if v.nightly:
        return []
    out = [("model", f"{model.name} has {MIXERS[m]} layers ({m}), which SGLang runs from {first} "
                     f"on, not {release}: give engine: {{name: sglang, version: '0.5.23'}}")
           for m, first in FIRST_RELEASE.items() if m in model.mixers and v < first]
    if model.attn_res_block and v < ATTN_RES_SINCE:
        out.append(("model", f"{model.name} has attention residuals (Kimi-K3), which SGLang runs "
                             f"from {ATTN_RES_SINCE} on, not {release}: give engine: "
                             f"{{name: sglang, version: '0.5.23'}}"))
    return out


SGLANG = register(EngineSpec(
    name="sglang", attr="SGLANG", doc="SGLang's server (python -m sglang.launch_server).",
    defaults=defaults, versions=VERSIONS, fitted=FITTED,
    kv_block_tokens=1,  # the radix cache's page_size (server_args.py default 1)
    hybrid_cache=hybrid_cache, model_refusals=family_refusals))
