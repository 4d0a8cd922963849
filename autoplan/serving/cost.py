"""What one engine iteration of a serving replica costs, and what its GPUs hold.

An iteration (continuous batching, Yu et al. 2022 "Orca") runs every scheduled token of
the batch through the model once: the prefill chunks' prompt tokens and one token per
decoding sequence. Per GPU of a pipeline stage it costs, layer by layer:

- the linear layers: the GEMMs of :mod:`autoplan.kernels.layer` (the one layer model
  training's stage costs read too) with m = tokens rows, each timed by
  :func:`autoplan.kernels.compute.gemm_time` (roofline, Williams et al. 2009, and the
  device's measured correction where it carries one) — compute-bound for a long prefill,
  bound by reading the weights (at the stored precision) for a decode batch;
- MoE layers: each token to ``top_k`` experts; the experts a batch touches are read
  whole: of E experts, E (1 - (1 - k/E)^T) expected for T tokens routed uniformly
  (:func:`autoplan.kernels.compute.batch_experts_time`);
- attention: prefill at flash attention's compute rate over the causal pairs
  (:func:`autoplan.kernels.compute.attention_time`, corrected where measured); decode
  reads each sequence's KV cache (bandwidth-bound; PagedAttention, Kwon et al. 2023);
  GQA keeps kv_heads / tp heads per GPU (at least one: engines replicate them past
  kv_heads), MLA its compressed latent (kv_lora_rank + rope dims, replicated over TP;
  DeepSeek-V2 Sec. 2.1; decode runs the absorbed form);
- a model whose layers differ (``serving.kinds``): each kind's mixer and MLP; Gated
  DeltaNet, Mamba-2's conv, DeepSeek Sparse Attention and DeepSeek-V4's compressed
  attention (C, H) from the measured mixer tables of the plan's engine where the device
  carries them, they apply and they hold the layer's shape (``Device.mixer_kernels``,
  :meth:`StepModel._init_tables`), the roofline elsewhere;
- tensor parallel: two all-reduces of the tokens' hidden states per layer (Megatron-LM,
  Shoeybi et al. 2019), expert parallel: a dispatch and a combine all-to-all of the
  routed tokens; pipeline parallel: a send of the hidden states per stage boundary; on
  the cluster's links through :mod:`autoplan.kernels.comm` (alpha-beta);
- weights per GPU: :func:`autoplan.kernels.layer.layer_params_per_rank` and the
  embedding and output layer's, as training holds them (split over TP or replicated);
- a GPU-side gap per kernel (``device.kernel_gap_s``) and the engine's host time per
  iteration (scheduling, input preparation): the release line's ``host_step_s``, plus its
  time per sampled sequence (sampling, detokenizing, streaming): ``host_seq_s``
  (``autoplan/serving/engines/``, fitted by ``benchmarks/serving_fit.py``, with the
  line's ``kernel_scale``: its kernels' time over the roofline's at the device's rates).
  An engine that overlaps scheduling with the GPU (SGLang's overlap scheduler, LMSYS blog
  2024-12-04; vLLM's async scheduling from 0.14; TensorRT-LLM's overlap scheduler, its docs'
  "Overlap Scheduler": the CPU prepares iteration i+1 while the GPU runs i) shows only the
  host time the GPU's work does not cover: an iteration of GPU time G and host time H with
  the line's ``host_hidden`` share h takes (1 - h) H + max(G, h H) (:func:`iteration_seconds`),
  G + H without the overlap, max(G, H) with all of it hidden. An iteration the engine does not
  replay as a CUDA graph launches its kernels from the host, ``launch_s`` each (fitted;
  0 where no fit gives it): the GPU runs no faster than they are issued.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from autoplan.descriptors.hardware import Cluster, Device, Link
from autoplan.descriptors.model import (
    COMPRESSED_MIXERS,
    CSA,
    FULL,
    HCA,
    LINEAR_MIXERS,
    MAMBA,
    MOE,
    NO_MIXER,
    NO_MLP,
    SLIDING,
    SPARSE,
    Model,
)
from autoplan.kernels import comm, mixers
from autoplan.kernels.compute import (
    AttentionCall,
    AttentionKernel,
    attention_efficiency,
    attention_time,
    batch_experts_time,
    gemm_time,
)
from autoplan.kernels.layer import (
    Gemm,
    embedding_params_per_rank,
    expert_params_per_rank,
    fused_elementwise_bytes_per_token,
    kv_bytes_per_token_layer,
    layer_gemms,
    layer_params_per_rank,
    output_params_per_rank,
)
from autoplan.serving import kinds
from autoplan.serving.deployment import Deployment, Precision, SpecMethod, resolved_limits
from autoplan.serving.engine import Engine, HybridCache, StateReuse, uses_recurrent
from autoplan.units import GiB
from autoplan.vocab import Dtype

ACT_BYTES = 2  # hidden states move in 16 bits between kernels and over the links
TABLE_PHASES = ("context", "generation")  # the phases a measured mixer table prices (prefill, decode)
# the mixers whose measured tables time a layer's whole block, its projections included
# (DeepSeek Sparse Attention's and DeepSeek-V4's attention modules): the block less its
# projections, which the layer's GEMMs price (StepModel._block_gemms)
BLOCK_MIXERS = (SPARSE, CSA, HCA)
# the GEMM dtype DeepSeek-V4's module tables were timed with (fp8_block: the collectors'
# FP8 checkpoints; autoplan.measured.aiconfigurator_mixers.DSV4_GEMM)
V4_TABLE_DTYPE = Dtype.FP8
LOGIT_BYTES = 4  # logits are sampled in fp32
# kernels per transformer layer in an iteration: a dense layer's 14 (norms, QKV, RoPE,
# attention, O, residual, the MLP's GEMMs and activation, the collectives); layers with more
# operators launch more (kernels_per_layer)
KERNELS_PER_LAYER = 14
# besides its GEMMs (kernels.layer.layer_gemms: 4 in a dense layer), a layer's kernels: two
# norms, RoPE, the KV-cache write, the attention kernel, the activation, two residual adds
# and two collectives
FIXED_KERNELS = KERNELS_PER_LAYER - 4
# an MoE layer's routed experts beyond its router GEMM: top-k, permute, the two grouped GEMMs,
# their activation, unpermute-and-combine (vLLM's fused_moe and SGLang's and TensorRT-LLM's
# MoE paths launch these as separate kernels)
ROUTED_KERNELS = 6
# MLA's two latent norms (its down and up projections are GEMMs in layer_gemms)
MLA_KERNELS = 2
# the one-shot all-reduce of serving engines (kernels/comm.py), under its older names here
ONE_SHOT_MAX_BYTES = comm.ONE_SHOT_MAX_BYTES
all_reduce_seconds = comm.serving_all_reduce


def kernels_per_layer(model: Model, gemms: int, moe: bool) -> int:
    """Kernels one layer launches in an iteration: its ``gemms`` GEMMs (layer_gemms' for the
    layer), the fixed operators around them (FIXED_KERNELS), an MoE layer's routed experts
    (ROUTED_KERNELS) and MLA's latent norms (MLA_KERNELS). A dense GQA layer: 4 + 10 = 14."""
    return gemms + FIXED_KERNELS + (ROUTED_KERNELS if moe else 0) + (MLA_KERNELS if model.is_mla else 0)


def prefill_prompts(tokens: float, pairs: float, prior: float) -> float:
    """How many prompts an iteration's prefill chunks are, from their ``tokens``, their causal
    (query, key) ``pairs`` and the ``prior`` tokens of earlier chunks they re-read, taking the
    chunks alike (``scheduler.Batch.add_chunk``: b chunks of c tokens after p each give
    pairs = b (c p + c (c + 1) / 2), tokens P = b c, prior = b p):
    b = (P prior + P^2 / 2) / (pairs - P / 2), between 1 and P. The measured mixer tables
    are timed per batch of sequences: one long prompt scans its chunks one after another,
    many short ones side by side."""
    if tokens <= 1.0:
        return 1.0
    own = pairs - tokens / 2
    if own <= 0.0:
        return tokens
    return min(tokens, max(1.0, (tokens * prior + tokens * tokens / 2) / own))


def iteration_seconds(gpu_s: float, host_s: float, hidden: float, launch_floor_s: float = 0.0) -> float:
    """An iteration's seconds from its GPU work ``gpu_s`` and its host time ``host_s``, of
    which the overlap scheduler hides the share ``hidden`` behind the GPU's work (the CPU
    prepares iteration i+1 while the GPU runs i): (1 - h) H + max(G, h H). ``launch_floor_s``:
    the host's time to launch the iteration's kernels one by one (no CUDA graph), which the
    GPU cannot run ahead of. h = 0 and no floor: G + H, the serial engine loop."""
    return (1.0 - hidden) * host_s + max(gpu_s, hidden * host_s, launch_floor_s)


def compute_dtype(weights: Precision, device: Device) -> Dtype:
    """The dtype the GEMMs run in: fp4 weights run fp4 GEMMs where the device has them
    (NVFP4 on Blackwell: TensorRT-LLM's, vLLM's and SGLang's nvfp4 paths quantize the
    activations too, W4A4), else fp8 GEMMs as fp8 weights do where the device has those
    (Hopper runs no fp4 MMA); int8/int4 are weight-only (dequantized to 16 bits in the
    kernel, W8A16/W4A16); the rest their own 16-bit type."""
    if weights is Precision.FP4 and device.supports(Dtype.FP4):
        return Dtype.FP4
    if weights in (Precision.FP8, Precision.FP4) and device.supports(Dtype.FP8):
        return Dtype.FP8
    return Dtype.FP16 if weights is Precision.FP16 else Dtype.BF16


def kv_transfer(model: Model, cluster: Cluster, d: Deployment,
                between: Link | None = None) -> tuple[float, float]:
    """(seconds, seconds per prompt token) to hand a request's KV cache from its prefill
    instance to a decode instance of a disaggregated deployment (DistServe, Zhong et al.
    2024, Sec. 4.3: the cache moves once per request, layer by layer over the fabric between
    the instances). Every layer's cache for every prompt token at the cache's precision; a
    request's cache lives on one attention-DP rank of each instance, split over its tp x pp
    GPUs, and the min(prefill tp x pp, decode tp x pp) GPU pairs each carry their share,
    over NVLink where both pools fit one NVLink domain and over the inter-node network
    (RDMA, as NIXL and Mooncake move it) otherwise; one link latency to start. ``between``:
    the link between two pools of a heterogeneous cluster, where the sides run on different
    ones (per GPU, per direction: ``PooledCluster.between_pools``)."""
    assert d.disaggregated is not None
    pre, dec = d.disaggregated.prefill, d.disaggregated.decode
    if between is not None:
        link = between
    else:
        link = cluster.intra_node if pre.gpus + dec.gpus <= cluster.nvlink_domain else cluster.inter_node
    pairs_Bps = min(pre.tp * pre.pp, dec.tp * dec.pp) * link.effective_Bps
    if model.is_hybrid or model.mlps:  # per kind (serving.kinds): KV of full and sparse layers
        # per token; the sliding layers' window and the recurrent states once per request
        shape = kinds.cache_shape(model, range(model.layers), 1, d.kv_cache.bytes, windowed=True)
        once = shape.state_per_sequence + shape.sliding_per_token * shape.window
        return link.latency_s + once / pairs_Bps, shape.kv_per_token / pairs_Bps
    per_token = model.layers * kv_bytes_per_token_layer(model, 1, d.kv_cache.bytes)
    return link.latency_s, per_token / pairs_Bps


@dataclass(frozen=True, slots=True)
class Memory:
    """Bytes per GPU (the fullest stage)."""

    weights: float
    kv_cache: float
    activations: float
    other: float

    @property
    def peak(self) -> float:
        return self.weights + self.kv_cache + self.activations + self.other

    def to_gib(self) -> dict[str, float]:
        return {"weights": self.weights / GiB, "kv_cache": self.kv_cache / GiB,
                "activations": self.activations / GiB, "other": self.other / GiB,
                "peak": self.peak / GiB}


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Seconds of one iteration by where they go (one pipeline traversal)."""

    gemm: float = 0.0
    moe: float = 0.0
    attention: float = 0.0
    kv_read: float = 0.0
    elementwise: float = 0.0
    tp_comm: float = 0.0
    ep_comm: float = 0.0
    pp_comm: float = 0.0
    logits: float = 0.0
    kernel_gaps: float = 0.0
    host: float = 0.0
    draft: float = 0.0  # speculative decoding's proposals (a draft model, an EAGLE/MTP head)

    @property
    def total(self) -> float:
        return (self.gemm + self.moe + self.attention + self.kv_read + self.elementwise + self.tp_comm
                + self.ep_comm + self.pp_comm + self.logits + self.kernel_gaps + self.host + self.draft)

    @property
    def device(self) -> float:
        """The GPU's seconds: everything but the host time."""
        return (self.gemm + self.moe + self.attention + self.kv_read + self.elementwise + self.tp_comm
                + self.ep_comm + self.pp_comm + self.logits + self.kernel_gaps + self.draft)

    def to_dict(self) -> dict[str, float]:
        names = ("gemm", "moe", "attention", "kv_read", "elementwise", "tp_comm", "ep_comm",
                 "pp_comm", "logits", "kernel_gaps", "host", "draft")
        return {n: getattr(self, n) for n in names}


def vision_params_per_rank(model: Model, tp: int) -> float:
    """A vision tower's weights on one GPU of the first stage, in 16 bits as engines keep
    it: its blocks split by heads over TP (vLLM's Qwen2.5/3-VL vision blocks run
    column/row-parallel linears), the patch embedding, positions and projector whole."""
    v = model.vision
    if v is None:
        return 0.0
    blocks = v.layers * v.params_block
    return blocks / tp + (v.params - blocks)


@dataclass
class StepModel:
    """Iteration times of one replica's scheduler (an attention-DP rank's batch), with the
    per-token constants worked out once: a simulation asks thousands of times."""

    model: Model
    cluster: Cluster
    deployment: Deployment
    engine: Engine
    version: str | None = None  # the engine release (None: its default line; serving.engine)
    _linear: dict[int, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)
    _tokens: dict[int, Breakdown] = field(default_factory=dict, init=False, repr=False)
    _token_totals: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _token_device: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _sampled: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    # the measured mixer tables' (a model whose layers differ: _init_tables): per mixer its
    # table kind and key, per (mixer, phase) the file that prices it, memoized lookups
    _table_keys: dict[str, tuple[str, str]] = field(default_factory=dict, init=False, repr=False)
    _table_sources: dict[tuple[str, str], str] = field(default_factory=dict, init=False, repr=False)
    _table_memo: dict[tuple[str, str, int, int], float] = field(default_factory=dict, init=False, repr=False)
    # a block mixer's projections as its table timed them (_block_gemms)
    _block_shapes: dict[str, tuple[tuple[float, float, float], ...]] = field(
        default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        d, m, dev = self.deployment, self.model, self.cluster.device
        self.device: Device = dev
        self.dtype = compute_dtype(d.weights, dev)
        self.layers_stage = math.ceil(m.layers / d.pp)
        moe_layers = m.moe_layers if m.is_moe else 0
        self.moe_stage = math.ceil(moe_layers / d.pp)
        self.dense_stage = self.layers_stage - self.moe_stage if m.is_moe else self.layers_stage
        self.stage_gpus = d.tp * d.attention_dp  # GPUs of one pipeline stage
        self.etp = max(1, self.stage_gpus // d.ep)  # each expert's matrices split over etp GPUs
        self.kv_token_layer = kv_bytes_per_token_layer(m, d.tp, d.kv_cache.bytes)
        self.tp_group = comm.place_group(self.cluster, d.tp, 1)
        self.ep_group = comm.place_group(self.cluster, d.ep, 1) if d.ep > 1 else None
        self.stage_group = comm.place_group(self.cluster, self.stage_gpus, 1)
        self.attn_eff = attention_efficiency(dev, AttentionKernel.FLASH3, False, 4096, m.qk_head_dim)
        self.mem_eff_Bps = dev.hbm_Bps * dev.hbm_efficiency
        # the engine's release line: its defaults and fitted constants, read once (a
        # simulation asks thousands of times)
        self.line = line = self.engine.spec.at(self.version)
        self.defaults = line.engine_defaults(dev)
        self._host_step, self._host_seq, self._kscale = line.host_step_s, line.host_seq_s, line.kernel_scale
        self.request_s = line.request_s  # the front end's time per request (serving.simulate)
        # the decode attention kernel's measured correction (decode_ratio), memoized
        # (MLA and DeepSeek-V4's one wide key-value head decode as those GQA rows never measured)
        self._decode_corr = None if self.model.is_mla or self.model.is_v4_attention else dev.correction
        self._decode_ratios: dict[tuple[int, int], float] = {}
        self._fraction: float | None = None  # memory_fraction, worked out once
        self._hidden = line.hidden_share(d)  # of the host time, the share the overlap hides
        self.max_num_seqs, self.max_batched_tokens, self.chunked_prefill = resolved_limits(
            d, self.engine, dev, self.version)
        # cross-node pipeline hops where a stage's GPUs fill whole NVLink domains
        self.pp_cross = self.stage_gpus >= self.cluster.nvlink_domain
        # attention per (query, key) pair of a prefill, and per token of context a decode
        # reads, over every layer (per GPU: heads / tp); MLA decodes in its absorbed form
        if m.is_mla:
            prefill_dim = m.qk_head_dim + m.v_head_dim
            decode_dim = (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        else:
            prefill_dim = decode_dim = 2 * m.kv_channels
        rate = dev.peak_bf16_flops * self.attn_eff
        heads = m.heads / d.tp
        # prefill through the kernels' one flash-attention time (the device's measured
        # correction applies, as to training's), at a 4096-token call
        prefill_call = self._prefill_call = AttentionCall(heads, 4096.0, m.qk_head_dim, m.heads / m.kv_heads,
                                                          True, False)
        self._prefill_s_per_pair = attention_time(self.layers_stage * d.pp * 2.0 * heads * prefill_dim,
                                                  prefill_call, dev, AttentionKernel.FLASH3)
        self._decode_s_per_token = 2.0 * heads * decode_dim / rate

        # the layer model's GEMMs, whose m is the iteration's tokens: their (n, k, bytes per
        # weight element: the stored precision's, the router's 16 bits), worked out once
        self._dense_shapes = self._shapes(layer_gemms(m, 1.0, d.tp))
        self._moe_shapes = self._shapes(layer_gemms(m, 1.0, d.tp, moe=True)) if m.is_moe else ()

        # speculative decoding: a decode verifies ``width`` positions and yields ``gain``
        # tokens on average; the proposals come from a draft model or a one-layer head
        spec = d.speculative
        self.width = 1 + spec.tokens if spec is not None else 1
        self.gain = spec.mean_tokens if spec is not None else 1.0
        self._draft: StepModel | None = None
        if spec is not None and spec.method is SpecMethod.DRAFT:
            assert spec.draft is not None
            # the draft runs beside the target on its TP group, one stage, dense
            self._draft = StepModel(spec.draft, self.cluster, replace(
                d, speculative=None, pp=1, ep=1, attention_dp=1, disaggregated=None), self.engine,
                self.version)
        self._head_moe = bool(spec is not None and spec.method is SpecMethod.MTP and m.is_moe)
        # kernels an iteration launches (those the kernel gaps count), and whether host and
        # GPU simply add up (no overlap, no launch floor: the arithmetic of the serial loop)
        self._layer_kernels = kernels_per_layer(m, len(self._dense_shapes), False)
        self._moe_layer_kernels = kernels_per_layer(m, len(self._moe_shapes), True) if m.is_moe else 0
        self._kernels = d.pp * (self.dense_stage * self._layer_kernels
                                + self.moe_stage * self._moe_layer_kernels)
        self._serial = self._hidden == 0.0 and line.launch_s == 0.0
        # a model whose layers differ (mixers/mlps patterns): costed kind by kind
        self.hybrid = bool(m.mixers or m.mlps)
        self.hybrid_cache: HybridCache = self.engine.spec.hybrid_cache(
            self.engine.spec.resolve(self.version).release, m)
        if self.hybrid:
            self._init_kinds()

    # -- per-layer pieces ---------------------------------------------------------------
    def _shapes(self, gemms: list[Gemm]) -> tuple[tuple[float, float, float], ...]:
        wb = self.deployment.weights.bytes
        return tuple((g.n, g.k, wb if g.quantized else ACT_BYTES) for g in gemms)

    def _gemms(self, tokens: float, shapes: tuple[tuple[float, float, float], ...]) -> float:
        """The layer's GEMMs for ``tokens`` rows at this deployment's precision, through the
        kernels' one GEMM time."""
        total = 0.0
        for n, k, weight_bytes in shapes:
            total += gemm_time(tokens, n, k, self.device, self.dtype, weight_bytes)
        return total

    def _linear_times(self, tokens: int) -> tuple[float, float]:
        """(a dense layer's GEMMs, an MoE layer's) for ``tokens`` rows."""
        cached = self._linear.get(tokens)
        if cached is not None:
            return cached
        m, d = self.model, self.deployment
        t = float(tokens)
        dense = self._gemms(t, self._dense_shapes)
        moe = 0.0
        if m.is_moe:
            # every attention-DP rank's tokens meet at the experts
            experts = batch_experts_time(m, t * d.attention_dp, d.ep, self.etp, self.device,
                                         self.dtype, d.weights.bytes)
            moe = self._gemms(t, self._moe_shapes) + experts
        out = (dense, moe)
        self._linear[tokens] = out
        return out

    def _per_tokens(self, tokens: int) -> Breakdown:
        """The parts of an iteration that depend on its token count alone (memoized)."""
        cached = self._tokens.get(tokens)
        if cached is not None:
            return cached
        if self.hybrid:
            out = self._tokens[tokens] = self._per_tokens_kinds(tokens)
            return out
        m, d, dev = self.model, self.deployment, self.device
        dense, moe = self._linear_times(tokens)
        L, Lm = self.layers_stage * d.pp, self.moe_stage * d.pp
        elementwise = L * tokens * fused_elementwise_bytes_per_token(m, d.tp) / self.mem_eff_Bps
        act = ACT_BYTES * tokens * m.hidden
        tp_comm = L * 2 * all_reduce_seconds(act, self.tp_group) if d.tp > 1 else 0.0
        ep_comm = 0.0
        if m.is_moe and self.ep_group is not None:
            # each routed copy in the experts' width (a latent MoE dispatches its latent)
            routed = act * m.expert_hidden / m.hidden * m.top_k * d.attention_dp / d.ep
            ep_comm = Lm * 2 * comm.all_to_all(routed, self.ep_group)
        elif m.is_moe and d.attention_dp > 1:  # experts split over the stage: gather, then reduce
            ep_comm = Lm * all_reduce_seconds(act * d.attention_dp, self.stage_group)
        pp_comm = ((d.pp - 1) * comm.p2p(act * m.pipeline_rows / d.tp, self.pp_cross, self.cluster)
                   if d.pp > 1 else 0.0)
        k = self._kscale
        out = Breakdown(gemm=k * self.dense_stage * d.pp * dense, moe=k * Lm * moe, elementwise=elementwise,
                        tp_comm=tp_comm, ep_comm=ep_comm, pp_comm=pp_comm,
                        kernel_gaps=self._kernels * dev.kernel_gap_s,
                        host=self._host_step)
        self._tokens[tokens] = out
        return out

    def _logits(self, sampled: int) -> float:
        """The output layer (16 bits in every engine's quantized checkpoints) over the
        sequences that sample, and their fp32 logits written and read by the sampler."""
        if not sampled:
            return 0.0
        cached = self._sampled.get(sampled)
        if cached is None:
            m, d = self.model, self.deployment
            cached = self._kscale * (
                gemm_time(sampled, m.vocab / d.tp, m.hidden, self.device, Dtype.BF16)
                + 2 * LOGIT_BYTES * sampled * m.vocab / d.tp / self.mem_eff_Bps)
            self._sampled[sampled] = cached
        return cached

    def decode_ratio(self, decodes: int, decode_context: float) -> float:
        """The measured/analytic ratio of the decode attention kernel for ``decodes``
        sequences holding ``decode_context`` tokens of context in all: the device's
        correction (``Correction.decode``, a profile's ``decode`` rows: the engine's
        generation-attention kernel, AIConfigurator's tables) at the mean context, rounded
        to an eighth of an octave (a simulation asks for every iteration); 1 where nothing
        was measured (no profile, an MLA model, whose absorbed decode those GQA rows do not
        measure, or a KV precision the profile lacks)."""
        corr = self._decode_corr
        if corr is None or decodes <= 0 or decode_context <= 0:
            return 1.0
        step = round(8 * math.log2(max(1.0, decode_context / decodes)))
        key = (decodes, step)
        ratio = self._decode_ratios.get(key)
        if ratio is None:
            m, d = self.model, self.deployment
            got = corr.decode(float(decodes), 2.0 ** (step / 8), m.heads / d.tp,
                              max(1.0, m.kv_heads / d.tp), float(m.kv_channels), d.kv_cache.bytes)
            ratio = self._decode_ratios[key] = 1.0 if got is None else got
        return ratio

    def _attention(self, decodes: int, decode_context: float, prefill_pairs: float,
                   prefill_context: float, prompt_tokens: float = 0.0) -> tuple[float, float]:
        """(prefill attention, KV read) over every layer: prefill compute-bound at flash
        attention's rate, decode bound by reading the KV cache (or its FLOPs, if more: a
        speculative verify's ``width`` queries per sequence read the cache once), times the
        decode kernel's measured ratio (:meth:`decode_ratio`; the same formula as
        :func:`autoplan.kernels.compute.decode_attention_time`, on which it is fitted). A model
        whose layers differ: kind by kind (:meth:`_attention_kinds`; ``prompt_tokens``: the
        prompt tokens the iteration computes)."""
        if self.hybrid:
            return self._attention_kinds(decodes, decode_context, prefill_pairs, prefill_context,
                                         prompt_tokens)
        attention = self._prefill_s_per_pair * prefill_pairs
        decode = max(decode_context * self.kv_token_layer / self.mem_eff_Bps,
                     self._decode_s_per_token * decode_context * self.width)
        kv_read = (self.decode_ratio(decodes, decode_context) * decode
                   + prefill_context * self.kv_token_layer / self.mem_eff_Bps)
        k = self._kscale
        return k * attention, k * self.layers_stage * self.deployment.pp * kv_read

    def _launch_floor(self, tokens: int, decodes: int) -> float:
        """The host's time to launch an iteration's kernels one by one, where the engine does
        not replay it as a CUDA graph (its line's graphs hold decode-only iterations of at
        most ``graph_max_batch`` sequences); 0 where replayed or no launch cost is fitted."""
        line = self.line
        if line.launch_s == 0.0:
            return 0.0
        replayed = (line.cuda_graphs and decodes > 0 and tokens == decodes * self.width
                    and (line.graph_max_batch == 0 or decodes <= line.graph_max_batch))
        return 0.0 if replayed else self._kernels * line.launch_s

    def decode_run(self, decodes: int, ctx: float) -> Callable[[int], float]:
        """Seconds of the first j decode-only iterations of ``decodes`` sequences starting
        at ``ctx`` tokens of context, each adding ``gain`` tokens a sequence, as a function
        of j (the simulation's runs of decode iterations). Serial: j A + c (j ctx + g n j (j-1)/2)
        (:meth:`decode_coefficients`). With the overlap or a launch floor F, iteration i takes
        (1 - h) H + max(G_i, F') with G_i = G_0 + s i rising in i and F' = max(F, h H): the
        first m iterations (G_i < F') take F' each, the rest G_i."""
        a, c = self.decode_coefficients(decodes, ctx)
        grown = decodes * self.gain
        if self._serial:
            return lambda j: j * a + c * (j * ctx + grown * j * (j - 1) / 2)
        w = self.width
        host = self._host_step + self._host_seq * decodes
        g0 = a - host + c * ctx  # decode_coefficients' A less the host time: the GPU's
        slope = c * grown
        floor = max(self._launch_floor(decodes * w, decodes), self._hidden * host)
        shown = (1.0 - self._hidden) * host

        def elapsed(j: int) -> float:
            if g0 >= floor:
                m = 0
            elif slope <= 0.0:
                m = j
            else:
                m = min(j, math.ceil((floor - g0) / slope))
            return j * shown + m * floor + (j - m) * g0 + slope * (j * (j - 1) - m * (m - 1)) / 2

        return elapsed

    def decode_coefficients(self, decodes: int, ctx: float = 0.0) -> tuple[float, float]:
        """(A, c): a decode-only iteration of ``decodes`` sequences holding ``ctx`` tokens of
        context takes A + c ctx in the serial engine loop (:meth:`step_seconds` with no
        prefill; host time included); :meth:`decode_run` sums runs of them. The decode
        kernel's measured ratio is taken at ``ctx`` (:meth:`decode_ratio`) and held over the
        run (a run grows the context by its length at most: its ratio moves little)."""
        w = self.width
        draft0 = self._draft_seconds(decodes, 0.0, 0, 0.0, 0.0)
        a = (self._per_tokens(decodes * w).total + self._logits(decodes * w) + self._host_seq * decodes
             + draft0)
        if self.hybrid:  # kind by kind, linear in the context about ``ctx``
            const, c = self._decode_kinds(decodes, ctx)
            a += self._kscale * const
            c *= self._kscale
        else:
            c = self._kscale * self.layers_stage * self.deployment.pp * max(
                self.kv_token_layer / self.mem_eff_Bps, self._decode_s_per_token * w)
            c *= self.decode_ratio(decodes, ctx)
        if decodes and self.deployment.speculative is not None:
            # the proposals' reads of the context: linear in it (a max of two linear terms)
            c += self._draft_seconds(decodes, 1.0, 0, 0.0, 0.0) - draft0
        return a, c

    # -- speculative decoding's proposals ---------------------------------------------
    def _head_layer(self, tokens: int) -> float:
        """One EAGLE/MTP head layer over ``tokens`` rows: its 2h -> h input projection (EAGLE
        Sec. 4; DeepSeek-V3 Sec. 2.2), one of the target's layers (an MoE layer for MTP on
        an MoE model), its elementwise traffic, TP all-reduces and kernel gaps."""
        m, d, dev = self.model, self.deployment, self.device
        dense, moe = self._linear_times(tokens)
        proj = gemm_time(tokens, m.hidden, 2 * m.hidden, dev, self.dtype)
        gemms = (moe if self._head_moe else dense) + proj
        rest = tokens * fused_elementwise_bytes_per_token(m, d.tp) / self.mem_eff_Bps
        if d.tp > 1:
            rest += 2 * all_reduce_seconds(ACT_BYTES * tokens * m.hidden, self.tp_group)
        kernels = self._moe_layer_kernels if self._head_moe else self._layer_kernels
        return self._kscale * gemms + rest + kernels * dev.kernel_gap_s

    def _draft_seconds(self, decodes: int, decode_context: float, prefill_tokens: int,
                       prefill_pairs: float, prefill_context: float) -> float:
        """Proposing the deployment's ``speculative.tokens`` tokens for each of ``decodes``
        sequences (one after another: each proposal feeds the next), and running the
        proposer over the iteration's prompt chunks (a draft model keeps its own KV cache;
        EAGLE and MTP heads read the target's hidden states of every token). N-gram
        proposals are host work (``host_seq_s``). An MTP head on an MoE model is costed
        without its own dispatch and combine."""
        spec = self.deployment.speculative
        if spec is None or spec.method is SpecMethod.NGRAM:
            return 0.0
        k = spec.tokens
        if self._draft is not None:  # its iterations' GPU work (the engine pays the host time once)
            dr = self._draft
            t = 0.0
            if dr._serial:  # the serial loop's arithmetic: its iterations less their host time
                if decodes:
                    t += k * (dr.step_seconds(decodes, decodes=decodes, decode_context=decode_context,
                                              prefill_pairs=0.0, prefill_context=0.0, sampled=decodes)
                              - dr._host_step - dr._host_seq * decodes)
                if prefill_tokens:
                    t += (dr.step_seconds(prefill_tokens, decodes=0, decode_context=0.0,
                                          prefill_pairs=prefill_pairs, prefill_context=prefill_context,
                                          sampled=0)
                          - dr._host_step)
                return t
            if decodes:
                t += k * dr.device_seconds(decodes, decodes=decodes, decode_context=decode_context,
                                           prefill_pairs=0.0, prefill_context=0.0, sampled=decodes)
            if prefill_tokens:
                t += dr.device_seconds(prefill_tokens, decodes=0, decode_context=0.0,
                                       prefill_pairs=prefill_pairs, prefill_context=prefill_context,
                                       sampled=0)
            return t
        t = 0.0
        if decodes:  # each proposal: the head layer, its KV read, the shared output head
            kv = max(decode_context * self.kv_token_layer / self.mem_eff_Bps,
                     self._decode_s_per_token * decode_context)
            t += k * (self._head_layer(decodes) + self._kscale * kv + self._logits(decodes))
        if prefill_tokens:
            t += self._head_layer(prefill_tokens)
        return t

    def _draft_memory(self) -> tuple[float, float]:
        """(weight bytes per GPU, KV bytes per token) the proposer adds: the draft model's,
        or one head layer (and its 2h x h projection in 16 bits) and its layer of KV."""
        spec, m, d = self.deployment.speculative, self.model, self.deployment
        if spec is None or spec.method is SpecMethod.NGRAM:
            return 0.0, 0.0
        if self._draft is not None:
            dr = self._draft
            return dr.memory_weights(), dr.kv_token_layer * dr.layers_stage
        layer = layer_params_per_rank(m, d.tp, self._head_moe)
        if self._head_moe:
            layer += expert_params_per_rank(m, d.ep, self.etp)
        return layer * d.weights.bytes + ACT_BYTES * 2 * m.hidden * m.hidden, self.kv_token_layer

    def iteration(self, tokens: int, *, decodes: int, decode_context: float,
                  prefill_pairs: float, prefill_context: float, sampled: int) -> Breakdown:
        """One iteration of one scheduler's batch through the whole pipeline.

        ``tokens``: scheduled tokens (prompt chunks + one per decode); ``decodes`` and
        ``decode_context``: the decoding sequences and the KV tokens they read;
        ``prefill_pairs``: causal (query, key) pairs of the prefill chunks, summed;
        ``prefill_context``: KV tokens of earlier chunks the prefill re-reads;
        ``sampled``: sequences that sample a token (decodes + prompts finishing). All but
        ``tokens`` are named at the call (six counts in a row are easily swapped)."""
        if tokens <= 0:
            return Breakdown()
        prompt = tokens - decodes * self.width
        attention, kv_read = self._attention(decodes, decode_context, prefill_pairs, prefill_context, prompt)
        base = self._per_tokens(tokens)
        draft = self._draft_seconds(decodes, decode_context, prompt, prefill_pairs, prefill_context)
        out = replace(base, attention=attention, kv_read=kv_read,
                      logits=self._logits(sampled + decodes * (self.width - 1)),
                      host=base.host + self._host_seq * sampled, draft=draft)
        if self._serial:
            return out
        gpu = out.device  # the host time the iteration shows: what the overlap leaves
        shown = iteration_seconds(gpu, out.host, self._hidden, self._launch_floor(tokens, decodes)) - gpu
        return replace(out, host=shown)

    def step_seconds(self, tokens: int, *, decodes: int, decode_context: float,
                     prefill_pairs: float, prefill_context: float, sampled: int) -> float:
        """:meth:`iteration`'s total, without building its breakdown (a simulation asks
        this every iteration). With pp > 1 the engine keeps pp batches in flight (vLLM's
        virtual engines): one batch's iteration still traverses every stage."""
        if tokens <= 0:
            return 0.0
        if not self._serial:
            return iteration_seconds(
                self.device_seconds(tokens, decodes=decodes, decode_context=decode_context,
                                    prefill_pairs=prefill_pairs, prefill_context=prefill_context,
                                    sampled=sampled),
                self._host_step + self._host_seq * sampled, self._hidden, self._launch_floor(tokens, decodes))
        total = self._token_totals.get(tokens)
        if total is None:
            total = self._token_totals[tokens] = self._per_tokens(tokens).total
        attention, kv_read = self._attention(decodes, decode_context, prefill_pairs, prefill_context,
                                             tokens - decodes * self.width)
        host = self._host_seq * sampled
        if self.width == 1:
            return total + attention + kv_read + self._logits(sampled) + host
        draft = self._draft_seconds(decodes, decode_context, tokens - decodes * self.width, prefill_pairs,
                                    prefill_context)
        return total + attention + kv_read + self._logits(sampled + decodes * (self.width - 1)) + host + draft

    def device_seconds(self, tokens: int, *, decodes: int, decode_context: float,
                       prefill_pairs: float, prefill_context: float, sampled: int) -> float:
        """The GPU's seconds of an iteration (:meth:`step_seconds` without host time)."""
        if tokens <= 0:
            return 0.0
        gpu = self._token_device.get(tokens)
        if gpu is None:
            gpu = self._token_device[tokens] = self._per_tokens(tokens).device
        attention, kv_read = self._attention(decodes, decode_context, prefill_pairs, prefill_context,
                                             tokens - decodes * self.width)
        logits = self._logits(sampled + decodes * (self.width - 1))
        if self.width == 1:
            return gpu + attention + kv_read + logits
        draft = self._draft_seconds(decodes, decode_context, tokens - decodes * self.width, prefill_pairs,
                                    prefill_context)
        return gpu + attention + kv_read + logits + draft

    # -- memory ---------------------------------------------------------------------
    def memory_weights(self) -> float:
        """Weight bytes per GPU of the fullest stage, at their precision (embedding and output
        layer in 16 bits, split over TP), as training holds them (kernels.layer)."""
        if self.hybrid:
            return self._stage_weights
        m, d = self.model, self.deployment
        wb = d.weights.bytes
        per_layer_dense = layer_params_per_rank(m, d.tp) * wb
        per_layer_moe = 0.0
        if m.is_moe:
            per_layer_moe = (layer_params_per_rank(m, d.tp, True)
                             + expert_params_per_rank(m, d.ep, self.etp)) * wb
        # the embedding (and a vision tower) on the first stage, the output layer on the last
        # (both where pp = 1)
        first = embedding_params_per_rank(m, d.tp) + vision_params_per_rank(m, d.tp)
        if d.pp == 1:
            ends = first + output_params_per_rank(m, d.tp, True)
        else:
            ends = max(first, output_params_per_rank(m, d.tp, False))
        return self.dense_stage * per_layer_dense + self.moe_stage * per_layer_moe + ends * ACT_BYTES

    def memory(self) -> Memory:
        """Per GPU of the fullest stage: weights (:meth:`memory_weights`, and a speculative
        proposer's), the activations of the largest iteration (``max_batched_tokens``), the
        device's reserve (CUDA context, NCCL buffers, CUDA graphs), and the KV cache: what
        the engine's memory budget leaves."""
        dev = self.device
        weights = self.memory_weights() + self._draft_memory()[0]
        activations = self._activation_bytes()
        other = dev.reserve_bytes
        kv = self._kv_budget(self.memory_fraction, weights, activations, other)
        return Memory(weights=weights, kv_cache=max(0.0, kv), activations=activations, other=other)

    def _activation_bytes(self) -> float:
        """The largest iteration's activations (``max_batched_tokens`` rows through the
        widest layer) and the sampler's fp32 logits of ``max_num_seqs`` sequences."""
        m, d = self.model, self.deployment
        width = 4 * m.hidden + m.mlp_matrices * max(m.ffn_hidden, m.expert_width * m.top_k) / d.tp
        return ACT_BYTES * self.max_batched_tokens * width + LOGIT_BYTES * self.max_num_seqs * m.vocab / d.tp

    def _kv_budget(self, fraction: float, weights: float, activations: float, other: float) -> float:
        """Bytes the engine's memory flag at ``fraction`` leaves the KV cache."""
        if self.defaults.memory_of_free:
            return fraction * (self.device.mem_bytes - weights - activations - other)
        return fraction * self.device.mem_bytes - weights - activations - other

    @property
    def memory_fraction(self) -> float:
        """The engine's memory flag as the launch sets it: its default, or, where that
        leaves no KV cache beside the weights, ``EngineDefaults.raised_fraction`` (the
        exports write the flag either way)."""
        cached = self._fraction
        if cached is None:
            weights = self.memory_weights() + self._draft_memory()[0]
            activations = self._activation_bytes()
            lim = self.defaults
            cached = lim.memory_fraction
            if (self._kv_budget(cached, weights, activations, self.device.reserve_bytes) <= 0
                    and lim.raised_fraction > cached):
                cached = lim.raised_fraction
            self._fraction = cached
        return cached

    def kv_tokens(self, mem: Memory) -> int:
        """Tokens of KV cache one scheduler (an attention-DP rank) can hold; a model whose layers
        differ: units of its pool (:meth:`pool_unit`: one token's KV of its full and sparse
        layers), of which each running sequence holds :attr:`seq_units` beside its tokens."""
        if self.hybrid:
            return int(mem.kv_cache // self.pool_unit())
        per_token = self.kv_token_layer * self.layers_stage + self._draft_memory()[1]
        return int(mem.kv_cache // per_token) if per_token > 0 else 0

    def pool_unit(self) -> float:
        """Bytes of one unit of the scheduler's KV pool: one token's KV of every layer on a
        GPU of a stage (a model whose layers differ: :attr:`serving.kinds.CacheShape.pool_unit`),
        with a speculative proposer's."""
        if not self.hybrid:
            return self.kv_token_layer * self.layers_stage + self._draft_memory()[1]
        return self.cache.pool_unit + self._draft_memory()[1]

    @property
    def seq_units(self) -> int:
        """Pool units a running sequence holds beside its tokens: a model's recurrent states
        and its windowed sliding layers' window (0 for a model whose layers are alike)."""
        if not self.hybrid or self.cache.seq_bytes <= 0:
            return 0
        return math.ceil(self.cache.seq_bytes / self.pool_unit())

    @property
    def prefix_block(self) -> int:
        """Tokens in which the engine's prefix cache reuses a shared prefix (0: not at all):
        its KV block; for a model with recurrent layers what its release keeps of their
        states (``EngineSpec.hybrid_cache``): none, a state per (state-sized) block, or one at
        the end of each block-aligned scheduler step (vLLM's align mode: steps of at most
        max_batched_tokens in whole blocks)."""
        block = self.engine.spec.kv_block_tokens
        if not self.hybrid or not uses_recurrent(self.model):
            return block
        hc = self.hybrid_cache
        if hc.reuse is StateReuse.NONE:
            return 0
        if hc.state_blocks:
            block = max(block, kinds.state_block_tokens(self.model, self.deployment.tp,
                                                        self.deployment.kv_cache.bytes))
        if hc.reuse is StateReuse.STEPS:
            return max(block, self.max_batched_tokens // block * block)
        return block

    # -- a model whose layers differ (serving.kinds) -------------------------------------
    def _init_kinds(self) -> None:
        """Per kind of layer: its GEMM shapes and kernels; the fullest stage's weights and
        cache shape (serving.kinds); the decode and prefill constants of each mixer."""
        m, d, dev = self.model, self.deployment, self.device
        self._kind_counts = m.kinds
        self._kind_shapes = {k: self._shapes(kinds.kind_gemms(m, k, 1.0, d.tp)) for k in self._kind_counts}
        self._kernels = sum(n * kernels_per_layer(m, len(self._kind_shapes[k]), k[1] == MOE)
                            for k, n in self._kind_counts.items())
        self._blocks = sum(n * ((k[0] != NO_MIXER) + (k[1] != NO_MLP)) for k, n in self._kind_counts.items())
        self._mixer_counts: dict[str, int] = {}
        for (mixer, _), n in self._kind_counts.items():
            self._mixer_counts[mixer] = self._mixer_counts.get(mixer, 0) + n
        # weights and cache per stage (vLLM's split of the layers); the fullest of each
        windowed = self.hybrid_cache.windowed
        weights, shapes = [], []
        stages = kinds.stage_layers(m.layers, d.pp)
        for i, layers in enumerate(stages):
            w = sum(kinds.layer_weights_per_rank(m, m.kind(j), d.tp, d.ep, self.etp) for j in layers)
            ends = 0.0
            if i == 0:
                ends += embedding_params_per_rank(m, d.tp) + vision_params_per_rank(m, d.tp)
            if i == len(stages) - 1:
                ends += output_params_per_rank(m, d.tp, d.pp == 1)
            weights.append(w * d.weights.bytes + ends * ACT_BYTES)
            shapes.append(kinds.cache_shape(m, layers, d.tp, d.kv_cache.bytes, windowed))
        self._stage_weights = max(weights)
        # a uniform pool over the stages: the most any stage holds per token and per sequence
        self.cache = kinds.CacheShape(max(c.kv_per_token for c in shapes),
                                      max(c.sliding_per_token for c in shapes), m.sliding_window,
                                      max(c.state_per_sequence for c in shapes))
        self.kv_token_layer = mixers.kv_bytes_per_token(m, m.mtp_kind[0], d.tp, d.kv_cache.bytes)
        # per (query, key) pair and per token of context, one layer, per GPU (heads / tp)
        rate = dev.peak_bf16_flops * self.attn_eff
        heads = m.heads / d.tp
        self._pair_s: dict[str, float] = {}
        self._ctx_s: dict[str, float] = {}  # decode: one token of context, the larger of read and FLOPs
        for mixer in self._mixer_counts:
            if mixer in (FULL, SLIDING, SPARSE, *COMPRESSED_MIXERS):
                # one (query, key) pair, and one key of context read: a compressed layer's
                # window and pooled keys are alike (one key-value head each)
                plain = FULL if mixer in (SPARSE, *COMPRESSED_MIXERS) else mixer
                dims = mixers.core_flops_per_token(m, plain, 2.0) / (2 * m.heads)
                call = AttentionCall(heads, 4096.0, m.qk_head_dim, m.heads / m.kv_heads, True, False)
                self._pair_s[mixer] = attention_time(2.0 * heads * dims, call, dev, AttentionKernel.FLASH3)
                kv = mixers.kv_bytes_per_token(m, plain, d.tp, d.kv_cache.bytes)
                decode_dim = (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank if m.is_mla else dims
                self._ctx_s[mixer] = max(kv / self.mem_eff_Bps, 2.0 * heads * decode_dim * self.width / rate)
        if SPARSE in self._mixer_counts:  # the indexer: its fp8 key of every token, its heads' scores
            key = mixers.kv_bytes_per_token(m, SPARSE, d.tp, d.kv_cache.bytes) - mixers.kv_bytes_per_token(
                m, FULL, d.tp, d.kv_cache.bytes)
            score = 2.0 * m.index_heads / d.tp * m.index_head_dim
            self._index_pair_s = score / rate
            self._index_ctx_s = max(key / self.mem_eff_Bps, score * self.width / rate)
        if CSA in self._mixer_counts:  # DeepSeek-V4's indexer: its FP4 key of every pooled token
            score = 2.0 * m.index_heads / d.tp * m.index_head_dim
            self._index_pair_s = score / rate
            self._index_ctx_s = max(mixers.v4_index_key_bytes(m) / self.mem_eff_Bps,
                                    score * self.width / rate)
        self._recurrent_s: dict[str, float] = {}  # prefill: per token; decode: per sequence
        self._state_s: dict[str, float] = {}
        for mixer in self._mixer_counts:
            if mixer in LINEAR_MIXERS:
                flops_token = (mixers.core_flops_per_token(m, mixer, 0.0)
                               + mixers.conv_flops_per_token(m, mixer)) / d.tp
                self._recurrent_s[mixer] = flops_token / rate
                state = mixers.state_bytes_per_sequence(m, mixer, d.tp, kinds.STATE_BYTES, ACT_BYTES)
                self._state_s[mixer] = 2.0 * state / self.mem_eff_Bps  # read and write, once a step
        self._init_tables(rate)

    # -- measured mixer tables (Device.mixer_kernels) -------------------------------------
    def _init_tables(self, rate: float) -> None:
        """The mixers a measured table prices (``Device.mixer_kernels``, the serving door's:
        AIConfigurator's timings of one layer; serving.kinds.table_key files a layer): per
        mixer its table kind and key, and per phase whether a table applies; a block mixer's
        projections as its table timed them (:meth:`_block_gemms`). What the tables leave to
        the roofline: Mamba-2's SSD scan and state (its tables time the conv);
        the projections of a sparse layer are in its measured block and priced apart with
        the layer's GEMMs, so the block's time less theirs is added here."""
        m, d = self.model, self.deployment
        tables = self.device.mixer_kernels
        if tables is None:
            return
        for mixer in self._mixer_counts:
            kind = kinds.TABLE_KINDS.get(mixer)
            key = None if kind is None else kinds.table_key(m, mixer, d.tp, d.kv_cache.value, d.weights.value)
            if kind is None or key is None:
                continue
            for phase in TABLE_PHASES:
                source = tables.source(kind, phase, key)
                if source is not None:
                    self._table_keys[mixer] = (kind, key)
                    self._table_sources[(mixer, phase)] = source
        if MAMBA in self._table_keys:  # the scan's FLOPs and the SSM state alone (no conv)
            self._scan_s = mixers.core_flops_per_token(m, MAMBA, 0.0) / d.tp / rate
            ssm = mixers.state_bytes_per_sequence(m, MAMBA, d.tp, kinds.STATE_BYTES, 0.0)
            self._ssm_state_s = 2.0 * ssm / self.mem_eff_Bps
        if SPARSE in self._table_keys:
            self._sparse_mixer_shapes = self._shapes(mixers.mixer_gemms(m, SPARSE, 1.0, d.tp))
            self._block_shapes[SPARSE] = self._sparse_mixer_shapes
        for mixer in COMPRESSED_MIXERS & self._table_keys.keys():  # fp8 weights, as timed
            self._block_shapes[mixer] = tuple((g.n, g.k, 1.0 if g.quantized else ACT_BYTES)
                                              for g in mixers.mixer_gemms(m, mixer, 1.0, d.tp))

    def _block_gemms(self, mixer: str, tokens: float) -> float:
        """The projections of a block mixer's layer for ``tokens`` rows as its table timed
        them, which its block's time is taken less of (the layer's GEMMs price them at the
        plan's precision): DSA's at the plan's (its tables' median over bf16 and fp8 GEMMs,
        taken for 16-bit and fp8 plans alone), DeepSeek-V4's at fp8 (its tables' one dtype),
        whatever the plan's weights."""
        shapes = self._block_shapes[mixer]
        if mixer == SPARSE:
            return self._gemms(tokens, shapes)
        return sum(gemm_time(tokens, n, k, self.device, V4_TABLE_DTYPE, wb) for n, k, wb in shapes)

    def table_sources(self) -> dict[str, dict[str, str | None]]:
        """Per mixer a measured table prices in some phase: phase (``context``, ``generation``)
        -> the file that prices it, None where the roofline does."""
        return {mixer: {phase: self._table_sources.get((mixer, phase)) for phase in TABLE_PHASES}
                for mixer in self._table_keys}

    def _measured(self, mixer: str, phase: str) -> bool:
        return (mixer, phase) in self._table_sources

    def _table_roofline(self, mixer: str, phase: str, batch: float, length: float) -> float:
        """The roofline's seconds of one layer's tabled part for ``batch`` sequences of
        ``length`` (what scales a measured time past its table's edge): the recurrent
        kernels' time is linear in tokens; a sparse layer's block is its projections, the
        indexer over every earlier key and MLA over at most index_topk of them; a compressed
        layer's its projections, its window's keys and its pooled ones (C: at most index_topk
        of them, and the indexer over all), as :meth:`_attention_kinds` and
        :meth:`_decode_kinds` price them."""
        m = self.model
        if mixer in COMPRESSED_MIXERS:
            return self._compressed_roofline(mixer, phase, batch, length)
        if mixer != SPARSE:
            return batch * length
        if phase == "context":
            pairs = batch * length * (length + 1) / 2
            sparse = batch * (length * min(length, m.index_topk) - min(length, m.index_topk) ** 2 / 2)
            return (self._gemms(batch * length, self._sparse_mixer_shapes)
                    + self._pair_s[SPARSE] * max(0.0, sparse) + self._index_pair_s * pairs)
        return (self._gemms(batch, self._sparse_mixer_shapes)
                + batch * (self._ctx_s[SPARSE] * min(length, m.index_topk) + self._index_ctx_s * length))

    def _compressed_roofline(self, mixer: str, phase: str, batch: float, length: float) -> float:
        """:meth:`_table_roofline` of a DeepSeek-V4 compressed layer (C, H)."""
        m, r = self.model, self._ratio(mixer)
        if phase == "context":
            pairs = batch * length * (length + 1) / 2
            pooled = pairs / r
            attend = min(pairs, batch * length * m.sliding_window)
            if mixer == CSA:
                attend += min(pooled, batch * length * m.index_topk)
                index = self._index_pair_s * pooled
            else:
                attend, index = attend + pooled, 0.0
            return self._block_gemms(mixer, batch * length) + self._pair_s[mixer] * attend + index
        keys = min(length, m.sliding_window) + (min(length / r, m.index_topk) if mixer == CSA else length / r)
        index = self._index_ctx_s * length / r if mixer == CSA else 0.0
        return self._block_gemms(mixer, batch) + batch * (self._ctx_s[mixer] * keys + index)

    def _table(self, mixer: str, phase: str, batch: float, length: float) -> float:
        """One layer's measured seconds of ``mixer`` for ``batch`` sequences of ``length``
        tokens (computed, or for a sparse layer's generation: read), the inputs rounded to
        1/32 octave (a simulation asks for every iteration); past the table's edge its
        edge's time scaled by the roofline's ratio (:meth:`_table_roofline`)."""
        qb, ql = round(32 * math.log2(max(1.0, batch))), round(32 * math.log2(max(1.0, length)))
        memo = (mixer, phase, qb, ql)
        got = self._table_memo.get(memo)
        if got is None:
            kind, key = self._table_keys[mixer]
            b, s = 2.0 ** (qb / 32), 2.0 ** (ql / 32)
            found = self.device.mixer_kernels.seconds(kind, phase, key, b, s)  # type: ignore[union-attr]
            assert found is not None  # _measured said a table applies
            got, tb, ts = found
            if (tb, ts) != (b, s):
                got *= self._table_roofline(mixer, phase, b, s) / self._table_roofline(mixer, phase, tb, ts)
            self._table_memo[memo] = got
        return got

    def _per_tokens_kinds(self, tokens: int) -> Breakdown:
        """:meth:`_per_tokens` kind by kind: each kind's GEMMs (an MoE kind's routed experts
        with them), one TP all-reduce per block (mixer or MLP), EP's per MoE layer."""
        m, d, dev = self.model, self.deployment, self.device
        t = float(tokens)
        gemm = moe = 0.0
        experts = None
        for kind, n in self._kind_counts.items():
            own = self._gemms(t, self._kind_shapes[kind])
            if kind[1] == MOE:
                if experts is None:
                    experts = batch_experts_time(m, t * d.attention_dp, d.ep, self.etp, dev, self.dtype,
                                                 d.weights.bytes)
                moe += n * (own + experts)
            else:
                gemm += n * own
        elementwise = m.layers * tokens * fused_elementwise_bytes_per_token(m, d.tp) / self.mem_eff_Bps
        act = ACT_BYTES * tokens * m.hidden
        tp_comm = self._blocks * all_reduce_seconds(act, self.tp_group) if d.tp > 1 else 0.0
        ep_comm = 0.0
        if m.is_moe and self.ep_group is not None:
            routed = act * m.expert_hidden / m.hidden * m.top_k * d.attention_dp / d.ep
            ep_comm = m.moe_layers * 2 * comm.all_to_all(routed, self.ep_group)
        elif m.is_moe and d.attention_dp > 1:
            ep_comm = m.moe_layers * all_reduce_seconds(act * d.attention_dp, self.stage_group)
        pp_comm = ((d.pp - 1) * comm.p2p(act * m.pipeline_rows / d.tp, self.pp_cross, self.cluster)
                   if d.pp > 1 else 0.0)
        k = self._kscale
        return Breakdown(gemm=k * gemm, moe=k * moe, elementwise=elementwise, tp_comm=tp_comm,
                         ep_comm=ep_comm, pp_comm=pp_comm, kernel_gaps=self._kernels * dev.kernel_gap_s,
                         host=self._host_step)

    def _decode_kinds(self, decodes: int, context: float) -> tuple[float, float]:
        """(const, slope): the decode reads of every layer for ``decodes`` sequences holding
        ``context`` tokens in all, const + slope x context about ``context`` (serving.kinds:
        full layers all of it, sliding ones min(C, n w), sparse ones the indexer's keys of all
        and the latent of min(C, n topk), recurrent ones 2 n state bytes). The decode kernel's
        measured ratio applies to the attention layers' part (GQA, as measured)."""
        m, n = self.model, float(decodes)
        const = slope = 0.0
        ratio = self.decode_ratio(decodes, context)
        for mixer, count in self._mixer_counts.items():
            if mixer == FULL:
                slope += count * self._ctx_s[FULL] * ratio
            elif self._measured(mixer, "generation"):
                c, s = self._decode_table(mixer, decodes, context)
                const += count * c
                slope += count * s
            elif mixer in (SLIDING, SPARSE):
                cap = n * (m.sliding_window if mixer == SLIDING else m.index_topk)
                per = self._ctx_s[mixer] * (ratio if mixer == SLIDING else 1.0)
                if context < cap:
                    slope += count * per
                else:
                    const += count * per * cap
                if mixer == SPARSE:
                    slope += count * self._index_ctx_s
            elif mixer in COMPRESSED_MIXERS:
                # the window's raw keys, min(C, n w); then the pooled keys (C / r): every one
                # (H), or the indexer's FP4 key of every one and min(C / r, n topk) picked (C)
                per, r = self._ctx_s[mixer], self._ratio(mixer)
                cap = n * m.sliding_window
                if context < cap:
                    slope += count * per
                else:
                    const += count * per * cap
                if mixer == CSA:
                    picked = n * m.index_topk
                    if context / r < picked:
                        slope += count * per / r
                    else:
                        const += count * per * picked
                    slope += count * self._index_ctx_s / r
                else:
                    slope += count * per / r
            elif mixer in LINEAR_MIXERS:
                const += count * n * self._state_s[mixer]
        return const, slope

    def _ratio(self, mixer: str) -> int:
        """Tokens a DeepSeek-V4 compressed layer pools into one key."""
        return self.model.csa_ratio if mixer == CSA else self.model.hca_ratio

    def _decode_table(self, mixer: str, decodes: int, context: float) -> tuple[float, float]:
        """(const, slope) of one layer's measured decode (:meth:`_decode_kinds`): a recurrent
        layer's kernels for ``decodes x width`` rows (Mamba-2: its conv; its SSM state read and
        written by the roofline), constant in the context; a sparse or compressed layer's
        block at the mean context a sequence reads, linear about it (its slope over an eighth
        of an octave), less its projections (priced with the layer's GEMMs)."""
        n = float(decodes)
        rows = n * self.width
        if mixer not in BLOCK_MIXERS:
            t = self._table(mixer, "generation", rows, 1.0)
            return t + (n * self._ssm_state_s if mixer == MAMBA else 0.0), 0.0
        per_seq = max(1.0, context / n)
        t0 = self._table(mixer, "generation", rows, per_seq)
        step = 2.0 ** (1 / 8)
        t1 = self._table(mixer, "generation", rows, per_seq * step)
        slope = max(0.0, (t1 - t0) / (n * per_seq * (step - 1)))
        t0 = max(0.0, t0 - self._block_gemms(mixer, rows))
        return t0 - slope * context, slope

    def _prefill_table(self, mixer: str, prompts: float, chunk: float, prior: float, tokens: float) -> float:
        """One layer's measured prefill for ``prompts`` chunks of ``chunk`` tokens after
        ``prior`` tokens each (:meth:`_attention_kinds`): a recurrent layer's kernels over the
        chunks (they carry the state in: no prior to re-read; Mamba-2: its conv, the SSD scan
        by the roofline over the ``tokens``); a sparse or compressed layer's block for the
        chunks, the part of a (prior + chunk)-token prefill past its first prior tokens where
        that is more, less its projections (priced with the layer's GEMMs)."""
        t = self._table(mixer, "context", prompts, chunk)
        if mixer == MAMBA:
            return t + self._scan_s * tokens
        if mixer not in BLOCK_MIXERS:
            return t
        if prior >= 1.0:
            t = max(t, self._table(mixer, "context", prompts, prior + chunk)
                    - self._table(mixer, "context", prompts, prior))
        return max(0.0, t - self._block_gemms(mixer, tokens))

    def _attention_kinds(self, decodes: int, decode_context: float, prefill_pairs: float,
                         prefill_context: float, prompt_tokens: float) -> tuple[float, float]:
        """(prefill core, decode reads) of every layer kind by kind (serving.kinds): the
        prefill's causal pairs over full layers, at most ``prompt_tokens x window`` of them
        over sliding ones, the indexer's over all pairs and MLA's over at most
        ``prompt_tokens x index_topk`` for sparse ones, the chunked scans' FLOPs per prompt
        token for recurrent ones; decode by :meth:`_decode_kinds`; earlier chunks' KV re-read
        by full and sparse layers (sliding ones: at most a window)."""
        m = self.model
        attention = reread = 0.0
        prompt = max(0.0, prompt_tokens)
        prompts = prefill_prompts(prompt, prefill_pairs, prefill_context) if prompt >= 1 else 0.0
        for mixer, count in self._mixer_counts.items():
            if prompts and self._measured(mixer, "context"):
                attention += count * self._prefill_table(mixer, prompts, prompt / prompts,
                                                         prefill_context / prompts, prompt)
            elif mixer == FULL:
                attention += count * self._pair_s[FULL] * prefill_pairs
                reread += count * prefill_context * self.kv_token_layer
            elif mixer == SLIDING:
                pairs = min(prefill_pairs, prompt * m.sliding_window)
                attention += count * self._pair_s[SLIDING] * pairs
                reread += count * min(prefill_context, float(m.sliding_window)) * mixers.kv_bytes_per_token(
                    m, SLIDING, self.deployment.tp, self.deployment.kv_cache.bytes)
            elif mixer == SPARSE:
                pairs = min(prefill_pairs, prompt * m.index_topk)
                attention += count * (self._pair_s[SPARSE] * pairs + self._index_pair_s * prefill_pairs)
                reread += count * prefill_context * mixers.kv_bytes_per_token(
                    m, SPARSE, self.deployment.tp, self.deployment.kv_cache.bytes)
            elif mixer in COMPRESSED_MIXERS:
                # the window's pairs (at most prompt x window), the pooled keys' (pairs / r:
                # all of them, or at most prompt x topk and the indexer's over all)
                r = self._ratio(mixer)
                pooled = prefill_pairs / r
                pairs = min(prefill_pairs, prompt * m.sliding_window)
                if mixer == CSA:
                    pairs += min(pooled, prompt * m.index_topk)
                    attention += count * self._index_pair_s * pooled
                else:
                    pairs += pooled
                attention += count * self._pair_s[mixer] * pairs
                tp, e = self.deployment.tp, self.deployment.kv_cache.bytes
                reread += count * (min(prefill_context, float(m.sliding_window))
                                   * mixers.window_bytes_per_token(m, mixer, e)
                                   + prefill_context * mixers.kv_bytes_per_token(m, mixer, tp, e))
            elif mixer in LINEAR_MIXERS:
                attention += count * self._recurrent_s[mixer] * prompt
        const, slope = self._decode_kinds(decodes, decode_context) if decodes else (0.0, 0.0)
        k = self._kscale
        return k * attention, k * (const + slope * decode_context + reread / self.mem_eff_Bps)

    def encoder_seconds(self, images: int, tokens_per_image: int) -> float:
        """The vision encoder's prefill of one request's ``images`` images of
        ``tokens_per_image`` language-model tokens each (``Model.vision``): merge^2 patches per
        LM token through its blocks, 2 FLOPs per block weight per patch and bidirectional
        attention over one image's patches (QK^T and AV: 4 x patches x hidden per patch), and
        its projector (2 FLOPs per weight per LM token); split over the TP group (vLLM's
        ``mm_encoder_tp_mode`` weights), at the attention kernels' rate."""
        v = self.model.vision
        if v is None or images <= 0 or tokens_per_image <= 0:
            return 0.0
        per_image = tokens_per_image * v.merge * v.merge
        patches = images * per_image
        block = 2.0 * v.params_block + 4.0 * per_image * v.attention_width
        merger = 2.0 * (1 + v.deepstack) * v.params_merger * images * tokens_per_image
        flops = v.layers * patches * block + merger
        return self._kscale * flops / self.deployment.tp / (self.device.peak_bf16_flops * self.attn_eff)
