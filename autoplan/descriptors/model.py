"""The application: a decoder-only transformer's architecture."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from autoplan.caches import memo
from autoplan.descriptors.strict import Fields
from autoplan.vocab import Activation, Norm, Position

# -- layer kinds ---------------------------------------------------------------------
# A model whose layers differ says so per layer in two strings of one symbol per layer
# (``mixers`` and ``mlps``), as Megatron-Core's hybrid layer pattern does
# (megatron/core/models/hybrid/hybrid_layer_allocation.py: M Mamba, G GDN, * attention,
# D DeepSeek sparse attention, - MLP, E MoE). Empty strings: every layer alike, the
# model's own attention and the first ``dense_layers`` dense.
FULL = "A"  # the model's attention over the whole causal context (MHA, GQA or MLA)
SLIDING = "W"  # the same attention over the last ``sliding_window`` tokens only
GDN = "G"  # Gated DeltaNet linear attention (Yang, Kautz, Hatamizadeh 2025; Qwen3-Next)
KDA = "K"  # Kimi Delta Attention, channel-wise gated delta rule (Kimi Linear, 2025)
MAMBA = "M"  # Mamba-2 selective state space (Dao & Gu 2024, SSD)
SPARSE = "D"  # DeepSeek Sparse Attention: MLA over index_topk keys a lightning indexer picks
# DeepSeek-V4's compressed attention (DeepSeek-V4 report: CSA and HCA): the sliding window's
# raw keys plus keys pooled from every csa_ratio (hca_ratio) tokens; CSA attends to the
# index_topk pooled keys its indexer picks, HCA to every pooled key
CSA = "C"
HCA = "H"
NO_MIXER = "."  # a layer without a token mixer (Nemotron-H's MLP-only layers)
MIXERS = {FULL: "full attention", SLIDING: "sliding-window attention", GDN: "gated delta net",
          KDA: "kimi delta attention", MAMBA: "mamba-2", SPARSE: "sparse attention",
          CSA: "compressed sparse attention", HCA: "heavily compressed attention",
          NO_MIXER: "none"}
COMPRESSED_MIXERS = frozenset({CSA, HCA})  # a window of raw keys and pooled keys beyond it
LINEAR_MIXERS = frozenset({GDN, KDA, MAMBA})  # a constant recurrent state per sequence
DENSE = "-"  # a dense MLP of ffn_hidden
MOE = "E"  # a mixture of experts
NO_MLP = "."  # a layer without an MLP (Nemotron-H's mixer-only layers)
MLPS = {DENSE: "dense MLP", MOE: "mixture of experts", NO_MLP: "none"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Model:
    """A decoder-only transformer, in the field names of the model file (docs/ARCHITECTURE.md).

    Parameter counts are derived properties; they count every weight, bias and
    norm parameter so they can be checked against published totals.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    activation: Activation
    position: Position
    tied_embeddings: bool
    max_seq_len: int
    norm: Norm = Norm.RMSNORM
    bias: bool = False  # linear layers carry biases (GPT-2/GPT-3/Megatron GPT do)
    dropout: bool = False  # dropout after attention/MLP (GPT-3 era yes, Llama no)
    head_dim: int = 0  # 0: hidden // heads
    qk_norm: bool = False  # per-head RMSNorm on Q and K (Qwen3, OLMo 2)
    qkv_bias: bool = False  # biases on Q, K and V only (Qwen2, Qwen2.5); bias covers every layer
    # -- mixture of experts (Shazeer et al. 2017; Fedus et al. 2022); experts = 0: dense
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 0  # routed experts each token goes to
    moe_ffn_hidden: int = 0  # hidden width of one routed expert
    shared_experts: int = 0  # experts every token goes through (DeepSeekMoE, Dai et al. 2024)
    shared_ffn_hidden: int = 0  # hidden width of one shared expert; 0: moe_ffn_hidden
    dense_layers: int = 0  # the first k layers keep a dense MLP of ffn_hidden
    capacity_factor: float = 0.0  # tokens an expert takes, x its fair share; 0: dropless
    # group-limited routing (DeepSeek-V2 Sec. 2.2.3 device-limited, V3 Sec. 2.1.2 node-
    # limited): experts split into route_groups groups of consecutive experts, each token's
    # top_k chosen among its route_group_topk best groups; 0: unrestricted
    route_groups: int = 0
    route_group_topk: int = 0
    # -- multi-head latent attention (DeepSeek-V2, Sec. 2.1); kv_lora_rank = 0: none
    q_lora_rank: int = 0  # 0: queries projected directly
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # -- multi-token prediction (DeepSeek-V3, Sec. 2.2): extra depth on the output stage
    mtp_layers: int = 0
    # -- layers that differ (see FULL ... NO_MLP above); "" = every layer alike
    mixers: str = ""  # each layer's token mixer, one symbol per layer
    mlps: str = ""  # each layer's MLP, one symbol per layer
    sandwich_norms: bool = False  # a norm before and after each block (Gemma 2/3/4)
    # attention variants
    sliding_window: int = 0  # tokens a sliding-window layer attends to (W layers)
    attention_sinks: bool = False  # a learned sink logit per head (gpt-oss)
    attn_output_gate: bool = False  # a sigmoid gate on the attention output (Qwen3-Next)
    global_head_dim: int = 0  # full-attention layers' head width where it differs (Gemma 4)
    global_kv_heads: int = 0  # full-attention layers' K/V heads where they differ (Gemma 4)
    global_k_eq_v: bool = False  # full-attention layers use their keys as values (Gemma 4)
    # linear attention (G and K layers): heads of the value (and output), of the query and
    # key, their widths, and the depthwise causal convolution's kernel (shared with Mamba)
    linear_heads: int = 0
    linear_key_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    conv_kernel: int = 0
    # Mamba-2 (M layers): heads x head width = the inner width; B and C per group
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state: int = 0
    ssm_groups: int = 0
    # DeepSeek sparse attention's lightning indexer (D layers; DeepSeek-V3.2-Exp report)
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    # DeepSeek-V4's attention (o_lora_rank > 0): queries through q_lora_rank, one key-value
    # head of head_dim serving as both, the output through o_groups low-rank groups
    o_groups: int = 0
    o_lora_rank: int = 0
    csa_ratio: int = 0  # tokens pooled into one key by a C layer's compressor
    hca_ratio: int = 0  # ... by an H layer's
    # hyper-connections (Zhu et al. 2025; DeepSeek-V4's manifold-constrained mHC): the
    # residual stream is hc_mult copies of hidden, mixed per block by Sinkhorn-normalized maps
    hc_mult: int = 0
    hc_sinkhorn_iters: int = 0
    # Kimi-K3: KDA layers' output gate full-rank (g_proj hidden -> heads x head_dim) instead of
    # through a low-rank pair; routed experts in a latent space of moe_latent (a down
    # projection before, an up projection after, an RMSNorm between where moe_latent_norm);
    # attention residuals: each block's input a learned softmax mix of the embedding and
    # earlier blocks of attn_res_block layers (Kimi Team 2026, "Attention Residuals")
    kda_full_gate: bool = False
    moe_latent: int = 0
    moe_latent_norm: bool = False
    attn_res_block: int = 0
    # weights a family adds to its experts
    expert_bias: bool = False  # experts carry biases (gpt-oss)
    router_bias: bool = False  # the router carries a bias (gpt-oss; DeepSeek-V3's
    # e_score_correction_bias, kept by Kimi Linear, Nemotron 3, MiniMax-M2)
    shared_expert_gate: bool = False  # a hidden -> 1 gate on the shared expert (Qwen)
    vision: Vision | None = None  # the image encoder of a multimodal model
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _cache_hash(self)

    def __hash__(self) -> int:
        return self._hash

    # -- shapes ----------------------------------------------------------------
    @property
    def kv_channels(self) -> int:
        """Per-head dimension d_head."""
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.kv_channels

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * d_head (GQA: Ainslie et al. 2023)."""
        return self.kv_heads * self.kv_channels

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_v4_attention(self) -> bool:
        """DeepSeek-V4's attention form: low-rank queries, one shared key-value head, the
        grouped low-rank output (``Model.o_lora_rank``)."""
        return self.o_lora_rank > 0

    @property
    def residual_streams(self) -> int:
        """Copies of the hidden state the residual stream carries (hyper-connections: hc_mult)."""
        return max(1, self.hc_mult)

    @property
    def pipeline_rows(self) -> int:
        """Copies of the hidden state a pipeline send carries per token: the hc_mult streams;
        with attention residuals the running block's sum and every earlier block's snapshot
        (one taken at each layer i with i % attn_res_block == 0, the embedding's at 0: SGLang's
        ``PPProxyTensors`` ship the bank), at the deepest boundary 1 + ceil((layers - 1) / B)."""
        if self.attn_res_block:
            return 1 + -(-(self.layers - 1) // self.attn_res_block)
        return self.residual_streams

    @property
    def attn_res_candidates(self) -> float:
        """The mean candidates an attention-residual mix weighs (the bank's snapshots and the
        running sum; Kimi-K3 modeling code ``_forward_attn_residual``): before layer i's
        attention ceil(i / B) + 1 (layer 0 mixes nothing), before its MLP floor(i / B) + 2,
        the final mix 1 + ceil(layers / B)."""
        b, n = self.attn_res_block, self.layers
        if not b:
            return 0.0
        total = sum((-(-i // b) + 1 if i else 0) + i // b + 2 for i in range(n)) + 1 + -(-n // b)
        return total / (2 * n + 1)

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (all but the first dense_layers)."""
        if self.mlps:
            return self.mlps.count(MOE)
        return self.layers - self.dense_layers if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based, model order) has a mixture of experts."""
        if self.mlps:
            return self.mlps[index] == MOE
        return self.is_moe and index >= self.dense_layers

    @property
    def is_hybrid(self) -> bool:
        """Its layers differ in their token mixer or in having an MLP at all."""
        return bool(self.mixers) or NO_MLP in self.mlps

    def mixer(self, index: int) -> str:
        """Layer ``index``'s token mixer (a symbol of :data:`MIXERS`)."""
        return self.mixers[index] if self.mixers else FULL

    def mlp(self, index: int) -> str:
        """Layer ``index``'s MLP (a symbol of :data:`MLPS`)."""
        if self.mlps:
            return self.mlps[index]
        return MOE if self.is_moe_layer(index) else DENSE

    def kind(self, index: int) -> tuple[str, str]:
        return self.mixer(index), self.mlp(index)

    @property
    def kinds(self) -> dict[tuple[str, str], int]:
        """Each (mixer, MLP) kind of layer, with how many layers are of it (model order of
        first appearance)."""
        return dict(_kinds(self))

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key (MLA: the no-RoPE and RoPE parts)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.kv_channels

    @property
    def v_channels(self) -> int:
        """Width of one head's value."""
        return self.v_head_dim if self.is_mla else self.kv_channels

    @property
    def attn_widths(self) -> tuple[int, int, int, int]:
        """(Q, K, V, attention output) widths over all heads, before TP. MLA trains with
        K and V decompressed per head (DeepSeek-V2, eq. 12-17); GQA shares K and V
        among the heads of a group (Ainslie et al. 2023)."""
        if self.is_mla:
            qk = self.heads * self.qk_head_dim
            return qk, qk, self.heads * self.v_head_dim, self.heads * self.v_head_dim
        if self.is_v4_attention:  # one head of head_dim is both key and value
            return self.q_dim, self.kv_channels, 0, self.q_dim
        return self.q_dim, self.kv_dim, self.kv_dim, self.q_dim

    @property
    def expert_width(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def shared_width(self) -> int:
        return self.shared_ffn_hidden or self.expert_width

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of hidden x ffn size: gated MLPs (GLU, Shazeer 2020) have 3."""
        return 3 if self.activation.gated else 2

    # -- parameter counts --------------------------------------------------------
    @property
    def params_norm(self) -> int:
        """One norm layer: RMSNorm has a scale, LayerNorm a scale and a shift."""
        return self.hidden * (2 if self.norm is Norm.LAYERNORM else 1)

    @property
    def params_attention(self) -> int:
        """Q, K, V and output projections (+ biases, + Q/K norms, + output gate, + sinks)
        of a full-attention layer."""
        if self.is_mla:
            return self.params_mla
        if self.is_v4_attention:
            return self.params_v4_attention
        return self._gqa_params(self.global_head_dim or self.kv_channels,
                                self.global_kv_heads or self.kv_heads, self.global_k_eq_v)

    @property
    def params_sliding(self) -> int:
        """A sliding-window layer's attention: the model's local heads."""
        if self.is_v4_attention:
            return self.params_v4_attention
        return self._gqa_params(self.kv_channels, self.kv_heads, False)

    def _gqa_params(self, d: int, kv_heads: int, k_eq_v: bool) -> int:
        """Multi-head attention with ``kv_heads`` K/V heads of width ``d``; ``k_eq_v``: no
        V projection (the keys are the values). The output gate doubles the Q projection
        (Qwen3-Next: q_proj's second half gates the output per channel); sinks add one
        logit per head (gpt-oss)."""
        q, kv = self.heads * d, kv_heads * d
        kvs = 1 if k_eq_v else 2
        gate = q if self.attn_output_gate else 0
        weights = self.hidden * (q + gate) + kvs * self.hidden * kv + q * self.hidden
        biases = (q + gate + kvs * kv + self.hidden if self.bias
                  else q + gate + kvs * kv if self.qkv_bias else 0)
        qk_norms = 2 * d if self.qk_norm else 0
        sinks = self.heads if self.attention_sinks else 0
        return weights + biases + qk_norms + sinks

    @property
    def params_indexer(self) -> int:
        """DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2 inference code,
        ``Indexer``): queries up from the q latent to index_heads heads, one shared key
        projection and its LayerNorm, and the per-head weights projection."""
        if not self.index_heads:
            return 0
        d, n = self.index_head_dim, self.index_heads
        q_in = self.q_lora_rank or self.hidden
        if self.is_v4_attention:  # V4: its keys pooled by a compressor of its own
            return q_in * n * d + self.hidden * n + self.params_compressor(self.csa_ratio, d)
        return q_in * n * d + self.hidden * d + 2 * d + self.hidden * n

    @property
    def params_v4_attention(self) -> int:
        """DeepSeek-V4's attention (DeepSeek-V4 inference code, ``Attention``): queries
        through wq_a, an RMSNorm and wq_b to every head's head_dim; one key-value head of
        head_dim (wkv and its RMSNorm); a sink logit per head; the grouped low-rank output,
        wo_a taking each of o_groups groups of heads to o_lora_rank and wo_b their
        concatenation to hidden."""
        h, n, d, r = self.hidden, self.heads, self.kv_channels, self.q_lora_rank
        q = h * r + r + r * n * d
        out = n * d * self.o_lora_rank + self.o_groups * self.o_lora_rank * h
        return q + h * d + d + out + n

    def params_compressor(self, ratio: int, d: int) -> int:
        """A DeepSeek-V4 ``Compressor`` pooling every ``ratio`` tokens into one key of ``d``:
        kv and gate projections from hidden, a learned bias per slot of the pooled window and
        an RMSNorm of d; the CSA ratio's compressor pools overlapping windows, so its
        projections and biases are twice as wide (``overlap``: coff = 2)."""
        coff = 2 if ratio == self.csa_ratio else 1
        return ratio * coff * d + 2 * self.hidden * coff * d + d

    @property
    def params_hyper_connections(self) -> int:
        """One block's hyper-connection maps (DeepSeek-V4 inference code, ``Block``: hc_fn,
        hc_base, hc_scale): the pre, post and residual mixes, (2 + m) m of them, projected
        from the m x hidden stream, their biases and three scales; none with one stream."""
        m = self.hc_mult
        if m <= 1:
            return 0
        mixes = (2 + m) * m
        return mixes * m * self.hidden + mixes + 3

    @property
    def params_gdn(self) -> int:
        """A Gated DeltaNet layer (transformers Qwen3NextGatedDeltaNet): q, k, v, z and the
        b, a gates projected from the hidden state, a depthwise causal conv over q, k, v
        (no bias), dt_bias and A_log per value head, a gated RMSNorm of one head's width,
        and the output projection."""
        key = self.linear_key_heads * self.linear_key_dim
        value = self.linear_heads * self.linear_value_dim
        proj = self.hidden * (2 * key + 2 * value + 2 * self.linear_heads)
        conv = (2 * key + value) * self.conv_kernel
        return proj + conv + 2 * self.linear_heads + self.linear_value_dim + value * self.hidden

    @property
    def params_kda(self) -> int:
        """A Kimi Delta Attention layer (Kimi Linear's KimiDeltaAttention): q, k, v
        projections with their own depthwise short convs (no bias), the channel-wise decay
        through a low-rank f_a/f_b pair and its dt_bias, the beta projection, A_log per
        head, the output gate through a low-rank g_a/g_b pair (Kimi-K3: one full-rank g_proj),
        a gated RMSNorm of one head's width and the output projection; every head is
        linear_key_dim wide."""
        d, n = self.linear_key_dim, self.linear_heads
        width = n * d
        qkv = 3 * self.hidden * width + 3 * width * self.conv_kernel
        decay = self.hidden * d + d * width + width
        # Kimi-K3's use_full_rank_gate: one g_proj hidden -> width
        gate = self.hidden * width if self.kda_full_gate else self.hidden * d + d * width
        return qkv + decay + gate + self.hidden * n + n + d + width * self.hidden

    @property
    def mamba_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def params_mamba(self) -> int:
        """A Mamba-2 mixer (Dao & Gu 2024, Sec. 7; transformers NemotronHMamba2Mixer): one
        input projection to z, x, B, C and dt, a depthwise causal conv over x, B and C
        with a bias, dt_bias, A_log and D per head, a gated RMSNorm over the inner width
        and the output projection (no biases on the projections)."""
        inner, bc = self.mamba_inner, 2 * self.ssm_groups * self.ssm_state
        proj = self.hidden * (2 * inner + bc + self.mamba_heads)
        conv = (inner + bc) * (self.conv_kernel + 1)
        return proj + conv + 3 * self.mamba_heads + inner + inner * self.hidden

    def params_mixer(self, mixer: str) -> int:
        """One layer's token mixer of kind ``mixer`` (a symbol of :data:`MIXERS`)."""
        if mixer == FULL:
            return self.params_attention
        if mixer == SLIDING:
            return self.params_attention if self.is_mla else self.params_sliding
        if mixer == SPARSE:
            return self.params_attention + self.params_indexer
        if mixer == CSA:
            return (self.params_attention + self.params_compressor(self.csa_ratio, self.kv_channels)
                    + self.params_indexer)
        if mixer == HCA:
            return self.params_attention + self.params_compressor(self.hca_ratio, self.kv_channels)
        if mixer == GDN:
            return self.params_gdn
        if mixer == KDA:
            return self.params_kda
        if mixer == MAMBA:
            return self.params_mamba
        return 0

    def params_mlp_of(self, mlp: str) -> int:
        """One layer's MLP of kind ``mlp``: a dense MLP, or a mixture of experts (router,
        every routed and shared expert)."""
        if mlp == DENSE:
            return self.params_mlp
        if mlp == MOE:
            return (self.params_router + self.experts * self.params_expert
                    + self.params_shared_experts + self.params_latent)
        return 0

    def params_kind(self, kind: tuple[str, str]) -> int:
        """One layer of ``kind`` (mixer, MLP): both, a norm before each (after too with
        sandwich norms) and each one's hyper-connection maps or attention-residual mix."""
        mixer, mlp = kind
        blocks = (mixer != NO_MIXER) + (mlp != NO_MLP)
        norms = blocks * (2 if self.sandwich_norms else 1) * self.params_norm
        hc = blocks * (self.params_hyper_connections + self.params_attn_res)
        return self.params_mixer(mixer) + self.params_mlp_of(mlp) + norms + hc

    @property
    def params_mla(self) -> int:
        """Multi-head latent attention (DeepSeek-V2 Sec. 2.1.2; DeepSeek-V3 modeling code):
        queries through a low-rank down/up projection with an RMSNorm between (or one
        projection without q_lora_rank); keys and values from one down projection to the
        kv latent plus the shared RoPE key, an RMSNorm, one up projection to every head's
        no-RoPE key and value; the output projection (and its gate, Kimi-K3)."""
        h, n = self.hidden, self.heads
        if self.q_lora_rank:
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * self.qk_head_dim
        else:
            q = h * n * self.qk_head_dim
        kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim))
        # Kimi-K3's mla_use_output_gate: g_proj hidden -> every head's value, a sigmoid gate
        gate = n * self.v_head_dim * h if self.attn_output_gate else 0
        return q + kv + n * self.v_head_dim * h + gate

    @property
    def params_mlp(self) -> int:
        weights = self.mlp_matrices * self.hidden * self.ffn_hidden
        up = (self.mlp_matrices - 1) * self.ffn_hidden
        biases = up + self.hidden if self.bias else 0
        return weights + biases

    @property
    def params_expert(self) -> int:
        """One routed expert: an MLP of moe_ffn_hidden over :attr:`expert_hidden` (biased where
        expert_bias: gpt-oss's gate_up_proj_bias and down_proj_bias)."""
        h = self.expert_hidden
        bias = ((self.mlp_matrices - 1) * self.expert_width + h) if self.expert_bias else 0
        return self.mlp_matrices * h * self.expert_width + bias

    @property
    def expert_hidden(self) -> int:
        """The width a routed expert reads and writes: the latent space where the experts run
        in one (Kimi-K3's routed_expert_hidden_size, Nemotron 3 Ultra's moe_latent_size),
        else hidden."""
        return self.moe_latent or self.hidden

    @property
    def params_latent(self) -> int:
        """An MoE layer's projections into and out of its experts' latent space and the
        RMSNorm between (Kimi-K3 modeling code, ``KimiSparseMoeBlock``: routed_expert_down_proj,
        routed_expert_norm, routed_expert_up_proj)."""
        if not self.moe_latent:
            return 0
        return 2 * self.hidden * self.moe_latent + (self.moe_latent if self.moe_latent_norm else 0)

    @property
    def params_attn_res(self) -> int:
        """One block's attention-residual weights (Kimi-K3 modeling code: a norm of hidden and
        a 1 x hidden pseudo-query per mix, ``*_res_norm`` and ``*_res_proj``)."""
        return 2 * self.hidden if self.attn_res_block else 0

    @property
    def params_router(self) -> int:
        """The router's linear layer, hidden -> experts (and a bias per expert)."""
        return self.experts * self.hidden + (self.experts if self.router_bias else 0)

    @property
    def params_shared_experts(self) -> int:
        gate = self.hidden if self.shared_expert_gate and self.shared_experts else 0
        return self.shared_experts * self.mlp_matrices * self.hidden * self.shared_width + gate

    @property
    def params_layer(self) -> int:
        """One dense transformer layer: attention, MLP and its two norms."""
        return self.params_attention + self.params_mlp + 2 * self.params_norm

    @property
    def params_moe_layer(self) -> int:
        """One MoE layer: attention, router, every routed and shared expert, two norms."""
        return (self.params_attention + self.params_router + self.experts * self.params_expert
                + self.params_shared_experts + self.params_latent + 2 * self.params_norm)

    @property
    def params_moe_layer_active(self) -> int:
        """What one token touches of an MoE layer: top_k of the routed experts."""
        return self.params_moe_layer - (self.experts - self.top_k) * self.params_expert

    @property
    def params_embedding(self) -> int:
        """Input embedding (+ learned positions)."""
        positions = self.max_seq_len * self.hidden if self.position is Position.LEARNED else 0
        return self.vocab * self.hidden + positions

    @property
    def params_output(self) -> int:
        """Final norm and the output projection (none of its own when tied); with
        hyper-connections, the head's map folding the m streams into one (DeepSeek-V4
        inference code: hc_head_fn, hc_head_base, hc_head_scale); with attention residuals
        the final mix's."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        m = self.hc_mult
        fold = m * m * self.hidden + m + 1 if m > 1 else 0
        # attention residuals: the last mix, before the final norm (output_attn_res_*)
        return self.params_norm + head + fold + self.params_attn_res

    @property
    def params_total(self) -> int:
        """Every parameter of the language model, the multi-token-prediction module
        excluded (as DeepSeek-V3 reports its 671B), the vision encoder included."""
        if (self.is_hybrid or self.mlps or self.sandwich_norms or self.hc_mult > 1
                or self.attn_res_block or self.moe_latent):
            layers = sum(n * self.params_kind(k) for k, n in self.kinds.items())
        else:
            dense = self.layers - self.moe_layers
            layers = dense * self.params_layer + self.moe_layers * self.params_moe_layer
        vision = self.vision.params if self.vision else 0
        return layers + self.params_embedding + self.params_output + vision

    @property
    def params_active(self) -> int:
        """Parameters touched per token (top_k of the routed experts); the total for
        dense models."""
        unused = self.moe_layers * (self.experts - self.top_k) * self.params_expert
        return self.params_total - unused

    @property
    def mtp_kind(self) -> tuple[str, str]:
        """An MTP module's layer: the model's attention (its sparse kind where the model's
        layers use it; DeepSeek-V4's sliding window, its MTP layer compressing nothing) and
        its MLP kind."""
        mixer = SPARSE if SPARSE in self.mixers else SLIDING if self.is_v4_attention else FULL
        return mixer, (MOE if self.is_moe else DENSE)

    @property
    def params_mtp_layer(self) -> int:
        """One multi-token-prediction module (DeepSeek-V3 Sec. 2.2, Fig. 3): RMSNorms of
        the hidden state and of the next token's embedding, the 2h -> h projection, one
        transformer layer and its output norm; embedding and output head are shared."""
        layer = self.params_kind(self.mtp_kind)
        return 2 * self.params_norm + 2 * self.hidden * self.hidden + layer + self.params_norm

    @property
    def params_mtp(self) -> int:
        return self.mtp_layers * self.params_mtp_layer

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "ffn_hidden": self.ffn_hidden,
            "vocab": self.vocab,
            "activation": self.activation.value,
            "position": self.position.value,
            "tied_embeddings": self.tied_embeddings,
            "max_seq_len": self.max_seq_len,
            "norm": self.norm.value,
            "bias": self.bias,
            "dropout": self.dropout,
        }
        if self.head_dim:
            out["head_dim"] = self.head_dim
        for key in _OPTIONAL:
            value = getattr(self, key)
            if value:
                out[key] = value
        if self.vision:
            out["vision"] = self.vision.to_dict()
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Vision:
    """A ViT image encoder and the projector feeding its patches to the language model
    (Qwen2.5/3-VL's vision tower, Kimi-K2.5's MoonViT, Gemma 4's): ``layers`` pre-norm
    blocks of bidirectional attention and an MLP over an image's patches, then
    ``merge`` x ``merge`` neighbouring patches made one language-model token of
    ``out_hidden``: concatenated and projected by a two-layer MLP (``projector: mlp``,
    Qwen-VL's PatchMerger, Kimi's mm_projector; ``deepstack`` more such mergers feed
    early LM layers, Qwen3-VL's DeepStack; ``projector: mlp_post_norm`` normalizes its
    output instead of its input, Kimi-K3's patchmergerv2) or pooled and projected by one
    linear layer (``projector: linear``, Gemma 4)."""

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    patch_size: int
    out_hidden: int
    merge: int = 1  # merge x merge patches make one LM token
    temporal_patch: int = 1  # frames one patch spans (video); an image is repeated
    channels: int = 3
    positions: int = 0  # learned position embeddings (rows of hidden)
    gated: bool = False  # gated (GLU) MLP blocks
    norm: Norm = Norm.LAYERNORM
    bias: bool = True  # biases on every linear layer and the patch embedding
    qk_norm: bool = False  # per-head Q/K norms
    sandwich_norms: bool = False  # a norm before and after each block (Gemma 4)
    final_norm: bool = False  # a norm after the last block (MoonViT)
    projector: str = "mlp"  # "mlp" (concat + two layers) or "linear" (pool + one layer)
    # an RMSNorm (a scale of hidden) on the pooled patch before the linear projector
    # (Gemma 3's mm_soft_emb_norm); the MLP projector's norm is counted in params_merger
    projector_norm: bool = False
    deepstack: int = 0
    attn_width: int = 0  # the attention's inner width where it differs from hidden (Kimi-K3)

    @property
    def attention_width(self) -> int:
        return self.attn_width or self.hidden

    @property
    def head_dim(self) -> int:
        return self.attention_width // self.heads

    @property
    def norm_params(self) -> int:
        return 2 if self.norm is Norm.LAYERNORM else 1

    @property
    def params_block(self) -> int:
        h, f, a = self.hidden, self.ffn_hidden, self.attention_width
        norms = (4 if self.sandwich_norms else 2) * self.norm_params * h
        mats = 3 if self.gated else 2
        biases = (3 * a + h + (mats - 1) * f + h) if self.bias else 0
        qk = 2 * self.head_dim if self.qk_norm else 0
        # q, k, v (hidden -> attention width each) and the output projection back
        return norms + 4 * h * a + mats * h * f + biases + qk

    @property
    def merged(self) -> int:
        """Width of merge x merge concatenated patches."""
        return self.hidden * self.merge * self.merge

    @property
    def params_merger(self) -> int:
        """One projector: the MLP's merged -> merged and merged -> out_hidden (biased) and
        its norm over one patch; or one bias-free hidden -> out_hidden projection (and the
        RMSNorm before it where ``projector_norm``)."""
        if self.projector == "linear":
            return self.hidden * self.out_hidden + (self.hidden if self.projector_norm else 0)
        m = self.merged
        if self.projector == "mlp_post_norm":  # Kimi-K3's: a norm over its output instead
            biases = m + self.out_hidden if self.bias else 0
            return m * m + m * self.out_hidden + biases + self.norm_params * self.out_hidden
        return m * m + m + m * self.out_hidden + self.out_hidden + self.norm_params * self.hidden

    @property
    def params(self) -> int:
        """Every weight: the patch embedding (a conv over channels x temporal_patch x
        patch^2), learned positions, the blocks, the final norm, the projector and the
        DeepStack mergers (each normed over the merged width: Qwen3-VL)."""
        h = self.hidden
        patch = self.channels * self.temporal_patch * self.patch_size ** 2 * h
        patch += h if self.bias else 0
        final = self.norm_params * h if self.final_norm else 0
        deep = self.deepstack * (self.params_merger - self.norm_params * h
                                 + self.norm_params * self.merged)
        return (patch + self.positions * h + self.layers * self.params_block + final
                + self.params_merger + deep)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                               if f.name not in _VISION_OPTIONAL or getattr(self, f.name)}
        out["norm"] = self.norm.value
        return out


PROJECTORS = ("mlp", "linear", "mlp_post_norm")
# written only when set, so the files of the towers before them stay as they were
_VISION_OPTIONAL = frozenset({"projector_norm", "attn_width"})


VISION_LIMITS = {"layers": 1 << 10, "hidden": 1 << 16, "heads": 1 << 10, "ffn_hidden": 1 << 18,
                 "patch_size": 1 << 10, "out_hidden": 1 << 18, "merge": 1 << 4,
                 "temporal_patch": 1 << 6, "channels": 1 << 4, "positions": 1 << 20,
                 "deepstack": 1 << 6}


def read_vision(f: Fields) -> Vision | None:
    """A :class:`Vision` from the mapping under ``model.vision``."""
    before = len(f.problems)
    values: dict[str, Any] = {}
    for key in ("layers", "hidden", "heads", "ffn_hidden", "patch_size", "out_hidden"):
        values[key] = f.int(key, min=1, max=VISION_LIMITS[key])
    for key, default in (("merge", 1), ("temporal_patch", 1), ("channels", 3)):
        values[key] = f.int(key, default, min=1, max=VISION_LIMITS[key])
    for key in ("positions", "deepstack"):
        values[key] = f.int(key, 0, min=0, max=VISION_LIMITS[key])
    for key in ("gated", "qk_norm", "sandwich_norms", "final_norm", "projector_norm"):
        values[key] = f.bool(key, False)
    values["norm"] = f.enum("norm", Norm, Norm.LAYERNORM)
    values["bias"] = f.bool("bias", True)
    values["projector"] = f.str("projector", "mlp")
    values["attn_width"] = f.int("attn_width", 0, min=0, max=VISION_LIMITS["hidden"])
    f.close()
    if values["projector"] not in (None, *PROJECTORS):
        f.fail("projector", f"expected one of {' | '.join(PROJECTORS)}, got {values['projector']!r}")
    elif values["projector_norm"] and values["projector"] != "linear":
        f.fail("projector_norm", "is the linear projector's norm (the MLP projector has its "
                                 "own): give projector: linear, or leave it out")
    if len(f.problems) > before:
        return None
    width = values["attn_width"] or values["hidden"]
    if width % values["heads"]:
        what = "attn_width" if values["attn_width"] else "hidden"
        f.fail("heads", f"expected a divisor of {what} ({width}), got {values['heads']}")
        return None
    return Vision(**values)


@memo(1024)
def _kinds(model: Model) -> tuple[tuple[tuple[str, str], int], ...]:
    """``Model.kinds``, counted once per model (the partitioner and each stage ask it)."""
    out: dict[tuple[str, str], int] = {}
    for i in range(model.layers):
        kind = model.kind(i)
        out[kind] = out.get(kind, 0) + 1
    return tuple(out.items())


# written only when set, so dense models' files stay as they were
_OPTIONAL = ("qk_norm", "qkv_bias", "experts", "top_k", "moe_ffn_hidden", "shared_experts",
             "shared_ffn_hidden", "dense_layers", "capacity_factor", "route_groups",
             "route_group_topk", "q_lora_rank",
             "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mtp_layers",
             "mixers", "mlps", "sandwich_norms", "sliding_window", "attention_sinks",
             "attn_output_gate", "global_head_dim", "global_kv_heads", "global_k_eq_v",
             "linear_heads", "linear_key_heads", "linear_key_dim", "linear_value_dim",
             "conv_kernel", "mamba_heads", "mamba_head_dim", "ssm_state", "ssm_groups",
             "index_heads", "index_head_dim", "index_topk", "o_groups", "o_lora_rank",
             "csa_ratio", "hca_ratio", "hc_mult", "hc_sinkhorn_iters", "kda_full_gate",
             "moe_latent", "moe_latent_norm", "attn_res_block", "expert_bias", "router_bias",
             "shared_expert_gate")
# the sizes among them, read as integers >= 0
_SIZES = ("sliding_window", "global_head_dim", "global_kv_heads", "linear_heads",
          "linear_key_heads", "linear_key_dim", "linear_value_dim", "conv_kernel",
          "mamba_heads", "mamba_head_dim", "ssm_state", "ssm_groups", "index_heads",
          "index_head_dim", "index_topk", "o_groups", "o_lora_rank", "csa_ratio", "hca_ratio",
          "hc_mult", "hc_sinkhorn_iters", "moe_latent", "attn_res_block")
_FLAGS = ("sandwich_norms", "attention_sinks", "attn_output_gate", "global_k_eq_v",
          "expert_bias", "router_bias", "shared_expert_gate", "kda_full_gate", "moe_latent_norm")


# physical ranges of a model's sizes, checked where a model is loaded (a file, a plan, an HF
# config.json): each well past the largest published model (hidden 25,600 and 128 layers at
# 1T+ parameters, 256K vocabularies, 10M-token contexts, 256 routed experts), far short of
# sizes whose products overflow the cost model's floats
LIMITS = {
    "layers": 1 << 12, "hidden": 1 << 18, "heads": 1 << 14, "ffn_hidden": 1 << 21,
    "vocab": 1 << 24, "max_seq_len": 1 << 27, "head_dim": 1 << 12, "experts": 1 << 14,
    "top_k": 1 << 10, "moe_ffn_hidden": 1 << 21, "shared_experts": 1 << 10,
    "shared_ffn_hidden": 1 << 21, "dense_layers": 1 << 12, "route_groups": 1 << 14,
    "route_group_topk": 1 << 14, "q_lora_rank": 1 << 18, "kv_lora_rank": 1 << 18,
    "qk_nope_head_dim": 1 << 12, "qk_rope_head_dim": 1 << 12, "v_head_dim": 1 << 12,
    "mtp_layers": 1 << 6, "sliding_window": 1 << 27, "global_head_dim": 1 << 12,
    "global_kv_heads": 1 << 14, "linear_heads": 1 << 14, "linear_key_heads": 1 << 14,
    "linear_key_dim": 1 << 12, "linear_value_dim": 1 << 12, "conv_kernel": 1 << 6,
    "mamba_heads": 1 << 14, "mamba_head_dim": 1 << 12, "ssm_state": 1 << 12,
    "ssm_groups": 1 << 12, "index_heads": 1 << 12, "index_head_dim": 1 << 12,
    "index_topk": 1 << 27, "o_groups": 1 << 14, "o_lora_rank": 1 << 18, "csa_ratio": 1 << 16,
    "hca_ratio": 1 << 16, "hc_mult": 1 << 6, "hc_sinkhorn_iters": 1 << 10,
    "moe_latent": 1 << 18, "attn_res_block": 1 << 12,
}


def out_of_range(model: Model) -> list[tuple[str, str]]:
    """(field, problem) for each of a model's sizes past :data:`LIMITS` (for readers that
    build a Model from another format, such as HF config.json)."""
    return [(key, f"expected a value <= {hi}, got {getattr(model, key)}")
            for key, hi in LIMITS.items() if getattr(model, key) > hi]


def read_model(f: Fields) -> Model | None:
    """Build a Model from the mapping under ``model:``; None when problems were recorded."""
    before = len(f.problems)
    values = dict(
        name=f.name("name"),
        layers=f.int("layers", min=1, max=LIMITS["layers"]),
        hidden=f.int("hidden", min=1, max=LIMITS["hidden"]),
        heads=f.int("heads", min=1, max=LIMITS["heads"]),
        kv_heads=f.int("kv_heads", f.raw("heads", None), min=1, max=LIMITS["heads"]),
        ffn_hidden=f.int("ffn_hidden", min=1, max=LIMITS["ffn_hidden"]),
        vocab=f.int("vocab", min=1, max=LIMITS["vocab"]),
        activation=f.enum("activation", Activation),
        position=f.enum("position", Position),
        tied_embeddings=f.bool("tied_embeddings"),
        max_seq_len=f.int("max_seq_len", min=1, max=LIMITS["max_seq_len"]),
        norm=f.enum("norm", Norm, Norm.RMSNORM),
        bias=f.bool("bias", False),
        dropout=f.bool("dropout", False),
        head_dim=f.int("head_dim", 0, min=0, max=LIMITS["head_dim"]),
        qk_norm=f.bool("qk_norm", False),
        qkv_bias=f.bool("qkv_bias", False),
        capacity_factor=f.float("capacity_factor", 0.0, min=0.0, max=1000.0),
    )
    for key in ("experts", "top_k", "moe_ffn_hidden", "shared_experts", "shared_ffn_hidden",
                "dense_layers", "route_groups", "route_group_topk", "q_lora_rank", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mtp_layers"):
        values[key] = f.int(key, 0, min=0, max=LIMITS[key])
    for key in _SIZES:
        values[key] = f.int(key, 0, min=0, max=LIMITS[key])
    for key in _FLAGS:
        values[key] = f.bool(key, False)
    values["mixers"] = f.str("mixers", None) or ""
    values["mlps"] = f.str("mlps", None) or ""
    values["vision"] = read_vision(f.child("vision", f.raw("vision"))) if f.has("vision") else None
    f.close()
    if len(f.problems) > before:
        return None
    v = values
    if v["heads"] % v["kv_heads"]:
        f.fail("kv_heads", f"expected a divisor of heads ({v['heads']}), got {v['kv_heads']}")
    if not v["head_dim"] and not v["kv_lora_rank"] and v["hidden"] % v["heads"]:
        f.fail("heads", f"expected a divisor of hidden ({v['hidden']}) or an explicit head_dim")
    _check_moe(f, v)
    _check_mla(f, v)
    check_kinds(f.fail, v)
    if len(f.problems) > before:
        return None
    return Model(**v)


# the sizes each mixer needs (the others must be left out)
_MIXER_SIZES = {
    SLIDING: ("sliding_window",),
    GDN: ("linear_heads", "linear_key_heads", "linear_key_dim", "linear_value_dim", "conv_kernel"),
    KDA: ("linear_heads", "linear_key_dim", "conv_kernel"),
    MAMBA: ("mamba_heads", "mamba_head_dim", "ssm_state", "ssm_groups", "conv_kernel"),
    SPARSE: ("index_heads", "index_head_dim", "index_topk"),
    CSA: ("sliding_window", "index_heads", "index_head_dim", "index_topk", "csa_ratio"),
    HCA: ("sliding_window", "hca_ratio"),
}


def check_kinds(fail: Any, v: dict[str, Any]) -> None:
    """The per-layer kinds of a model (``v``: Model's fields by name; ``fail(field,
    message)`` records a problem): patterns one known symbol per layer, each mixer's
    sizes given, sizes no layer uses left out. Model files and HF readers both call it."""
    layers = v["layers"]
    for key, symbols in (("mixers", MIXERS), ("mlps", MLPS)):
        pattern = v[key]
        if not pattern:
            continue
        bad = sorted(set(pattern) - set(symbols))
        if bad:
            known = ", ".join(f"{c} ({what})" for c, what in symbols.items())
            fail(key, f"unknown symbol {bad[0]!r}; expected one per layer of {known}")
        elif len(pattern) != layers:
            fail(key, f"expected one symbol per layer ({layers}), got {len(pattern)}")
    mixers = set(v["mixers"] or FULL)
    needed = {key for m in mixers for key in _MIXER_SIZES.get(m, ())}
    for mixer, keys in _MIXER_SIZES.items():
        for key in keys:
            if mixer in mixers and not v[key]:
                fail(key, f"missing: the {MIXERS[mixer]} layers ({mixer}) need it")
            elif key not in needed and v[key]:
                fail(key, f"is a {MIXERS[mixer]} field, and no layer is {mixer} in mixers")
    if SPARSE in mixers and not v["kv_lora_rank"]:
        fail("mixers", "sparse attention (D) runs over multi-head latent attention: give kv_lora_rank")
    _check_v4_attention(fail, v, mixers)
    if v["mixers"] and set(v["mixers"]) == {NO_MIXER}:
        fail("mixers", "no layer mixes tokens: expected at least one mixer")
    mlps = v["mlps"]
    if mlps:
        if MOE in mlps and not v["experts"]:
            fail("mlps", "has mixture-of-experts layers (E): give experts too")
        if v["experts"] and MOE not in mlps:
            fail("experts", "no layer is a mixture of experts (E) in mlps")
        if v["dense_layers"]:
            fail("dense_layers", "mlps places the dense layers: leave dense_layers out")
        if v["mixers"] and len(mlps) == len(v["mixers"]) == layers and any(
                a == NO_MIXER and b == NO_MLP for a, b in zip(v["mixers"], mlps, strict=True)):
            fail("mlps", "a layer without a mixer needs an MLP (. in both at one layer)")
    for key in ("global_head_dim", "global_kv_heads"):
        if v[key] and SLIDING not in mixers:
            fail(key, "sets full-attention layers apart from sliding ones: no layer is W")
    if v["global_kv_heads"] and v["heads"] and v["heads"] % v["global_kv_heads"]:
        fail("global_kv_heads", f"expected a divisor of heads ({v['heads']})")
    if v["linear_key_heads"] and v["linear_heads"] and v["linear_heads"] % v["linear_key_heads"]:
        fail("linear_key_heads", f"expected a divisor of linear_heads ({v['linear_heads']})")


def _check_v4_attention(fail: Any, v: dict[str, Any], mixers: set[str]) -> None:
    """DeepSeek-V4's attention and hyper-connection fields (``check_kinds``'s ``fail``)."""
    if mixers & COMPRESSED_MIXERS and not v["o_lora_rank"]:
        fail("mixers", "compressed attention (C, H) runs over DeepSeek-V4's attention: give "
                       "o_lora_rank, o_groups and q_lora_rank")
    if v["o_lora_rank"] or v["o_groups"]:
        if not v["o_lora_rank"] or not v["o_groups"]:
            fail("o_lora_rank" if not v["o_lora_rank"] else "o_groups",
                 "o_lora_rank and o_groups go together")
        elif v["heads"] and v["heads"] % v["o_groups"]:
            fail("o_groups", f"expected a divisor of heads ({v['heads']}), got {v['o_groups']}")
        if not v["q_lora_rank"]:
            fail("q_lora_rank", "missing: DeepSeek-V4's attention (o_lora_rank) projects its "
                                "queries through q_lora_rank")
        if v["kv_lora_rank"]:
            fail("kv_lora_rank", "DeepSeek-V4's attention (o_lora_rank) has one key-value head, "
                                 "no latent: leave kv_lora_rank out")
        if v["kv_heads"] != 1:
            fail("kv_heads", f"DeepSeek-V4's attention (o_lora_rank) has one key-value head: "
                             f"expected 1, got {v['kv_heads']}")
        if SPARSE in mixers:
            fail("mixers", "sparse attention (D) is MLA's; DeepSeek-V4's attention selects keys "
                           "in compressed sparse layers (C)")
        width = v["head_dim"] or (v["hidden"] // v["heads"] if v["heads"] else 0)
        if v["qk_rope_head_dim"] > width:
            fail("qk_rope_head_dim", f"expected at most the head's width ({width}), got "
                                     f"{v['qk_rope_head_dim']}")
    for key in ("csa_ratio", "hca_ratio"):
        if v[key] == 1:
            fail(key, "expected at least 2 tokens pooled per key, got 1")
    if v["csa_ratio"] and v["csa_ratio"] == v["hca_ratio"]:
        fail("hca_ratio", f"expected a ratio apart from csa_ratio ({v['csa_ratio']})")
    if v["hc_sinkhorn_iters"] and v["hc_mult"] <= 1:
        fail("hc_sinkhorn_iters", "is a hyper-connection field: give hc_mult >= 2 too")
    if v["hc_mult"] > 1 and v["attn_res_block"]:
        fail("attn_res_block", "hyper-connections (hc_mult) and attention residuals replace the "
                               "same residual: give one")
    if v["kda_full_gate"] and KDA not in mixers:
        fail("kda_full_gate", "is a Kimi Delta Attention field, and no layer is K in mixers")
    if (v["moe_latent"] or v["moe_latent_norm"]) and not v["experts"]:
        fail("moe_latent" if v["moe_latent"] else "moe_latent_norm",
             "is a mixture-of-experts field: give experts too (or leave it out)")
    elif v["moe_latent_norm"] and not v["moe_latent"]:
        fail("moe_latent_norm", "normalizes the experts' latent space: give moe_latent too")


def _check_moe(f: Fields, v: dict[str, Any]) -> None:
    if not v["experts"]:
        for key in ("top_k", "moe_ffn_hidden", "shared_experts", "shared_ffn_hidden",
                    "dense_layers", "capacity_factor", "route_groups", "route_group_topk"):
            if v[key]:
                f.fail(key, "is a mixture-of-experts field: give experts too (or leave it out)")
        return
    if not 1 <= v["top_k"] <= v["experts"]:
        f.fail("top_k", f"expected 1 <= top_k <= experts ({v['experts']}), got {v['top_k']}")
    if v["dense_layers"] >= v["layers"]:
        f.fail("dense_layers", f"expected fewer than layers ({v['layers']}), got {v['dense_layers']}")
    if v["shared_ffn_hidden"] and not v["shared_experts"]:
        f.fail("shared_ffn_hidden", "needs shared_experts >= 1")
    if v["capacity_factor"] and v["capacity_factor"] * v["top_k"] < 1:
        f.fail("capacity_factor", "expected capacity_factor * top_k >= 1 (each token needs a slot)")
    _check_route_groups(f, v)


def _check_route_groups(f: Fields, v: dict[str, Any]) -> None:
    """Group-limited routing as Megatron-Core checks it (--moe-router-num-groups must divide
    the experts, --moe-router-group-topk <= groups), and the groups must hold top_k experts."""
    groups, top = v["route_groups"], v["route_group_topk"]
    if not groups and not top:
        return
    if not groups or not top:
        f.fail("route_groups" if not groups else "route_group_topk",
               "route_groups and route_group_topk go together")
        return
    problem = route_group_problem(v["experts"], v["top_k"], groups, top)
    if problem is not None:
        f.fail("route_groups" if problem[0] == "groups" else "route_group_topk", problem[1])


def route_group_problem(experts: int, top_k: int, groups: int,
                        group_topk: int) -> tuple[str, str] | None:
    """("groups" | "group_topk", what is wrong) of group-limited routing as Megatron-Core
    checks it (--moe-router-num-groups divides the experts, --moe-router-group-topk is at
    most the groups), and its chosen groups must hold top_k experts; None where it holds.
    Model files and HF configs (n_group, topk_group) both read it."""
    if experts % groups:
        return "groups", f"expected a divisor of the {experts} experts, got {groups}"
    if group_topk > groups:
        return "group_topk", f"expected at most the {groups} groups, got {group_topk}"
    if group_topk * (experts // groups) < top_k:
        return "group_topk", (f"{group_topk} groups of {experts // groups} experts cannot hold "
                              f"top_k = {top_k}")
    return None


def _check_mla(f: Fields, v: dict[str, Any]) -> None:
    dims = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if not v["kv_lora_rank"]:
        # DeepSeek-V4's attention projects queries through q_lora_rank without MLA, and
        # rotates the last qk_rope_head_dim channels of its heads
        v4 = ("q_lora_rank", "qk_rope_head_dim") if v["o_lora_rank"] else ()
        for key in (*dims, "q_lora_rank"):
            if key in v4:
                continue
            if v[key]:
                f.fail(key, "is a multi-head latent attention field: give kv_lora_rank too")
        return
    for key in dims:
        if not v[key]:
            f.fail(key, "missing: multi-head latent attention (kv_lora_rank > 0) needs it")
    if v["kv_heads"] != v["heads"]:
        f.fail("kv_heads", f"multi-head latent attention has one key and value per head: "
                           f"expected heads ({v['heads']}) or nothing, got {v['kv_heads']}")


def _cache_hash(obj: object) -> None:
    """Frozen descriptors are hashed on every memoized cost lookup: hash them once."""
    values = tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.compare)  # type: ignore[arg-type]
    object.__setattr__(obj, "_hash", hash(values))
