"""The application: a decoder-only transformer's architecture."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from autoplan.descriptors.strict import Fields
from autoplan.vocab import Activation, Norm, Position


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
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (all but the first dense_layers)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based, model order) has a mixture of experts."""
        return self.is_moe and index >= self.dense_layers

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
        """Q, K, V and output projections (+ biases, + Q/K norms)."""
        if self.is_mla:
            return self.params_mla
        weights = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        biases = (self.q_dim + 2 * self.kv_dim + self.hidden if self.bias
                  else self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0)
        qk_norms = 2 * self.kv_channels if self.qk_norm else 0
        return weights + biases + qk_norms

    @property
    def params_mla(self) -> int:
        """Multi-head latent attention (DeepSeek-V2 Sec. 2.1.2; DeepSeek-V3 modeling code):
        queries through a low-rank down/up projection with an RMSNorm between (or one
        projection without q_lora_rank); keys and values from one down projection to the
        kv latent plus the shared RoPE key, an RMSNorm, one up projection to every head's
        no-RoPE key and value; the output projection."""
        h, n = self.hidden, self.heads
        if self.q_lora_rank:
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * self.qk_head_dim
        else:
            q = h * n * self.qk_head_dim
        kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + n * self.v_head_dim * h

    @property
    def params_mlp(self) -> int:
        weights = self.mlp_matrices * self.hidden * self.ffn_hidden
        up = (self.mlp_matrices - 1) * self.ffn_hidden
        biases = up + self.hidden if self.bias else 0
        return weights + biases

    @property
    def params_expert(self) -> int:
        """One routed expert: an MLP of moe_ffn_hidden without biases."""
        return self.mlp_matrices * self.hidden * self.expert_width

    @property
    def params_router(self) -> int:
        """The router's linear layer, hidden -> experts (no bias)."""
        return self.experts * self.hidden

    @property
    def params_shared_experts(self) -> int:
        return self.shared_experts * self.mlp_matrices * self.hidden * self.shared_width

    @property
    def params_layer(self) -> int:
        """One dense transformer layer: attention, MLP and its two norms."""
        return self.params_attention + self.params_mlp + 2 * self.params_norm

    @property
    def params_moe_layer(self) -> int:
        """One MoE layer: attention, router, every routed and shared expert, two norms."""
        return (self.params_attention + self.params_router + self.experts * self.params_expert
                + self.params_shared_experts + 2 * self.params_norm)

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
        """Final norm and the output projection (none of its own when tied)."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.params_norm + head

    @property
    def params_total(self) -> int:
        """Every parameter of the model, the multi-token-prediction module excluded (as
        DeepSeek-V3 reports its 671B)."""
        dense = self.layers - self.moe_layers
        return (dense * self.params_layer + self.moe_layers * self.params_moe_layer
                + self.params_embedding + self.params_output)

    @property
    def params_active(self) -> int:
        """Parameters touched per token (top_k of the routed experts); the total for
        dense models."""
        unused = self.moe_layers * (self.experts - self.top_k) * self.params_expert
        return self.params_total - unused

    @property
    def params_mtp_layer(self) -> int:
        """One multi-token-prediction module (DeepSeek-V3 Sec. 2.2, Fig. 3): RMSNorms of
        the hidden state and of the next token's embedding, the 2h -> h projection, one
        transformer layer and its output norm; embedding and output head are shared."""
        layer = self.params_moe_layer if self.is_moe else self.params_layer
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
        return out


# written only when set, so dense models' files stay as they were
_OPTIONAL = ("qk_norm", "qkv_bias", "experts", "top_k", "moe_ffn_hidden", "shared_experts",
             "shared_ffn_hidden", "dense_layers", "capacity_factor", "route_groups",
             "route_group_topk", "q_lora_rank",
             "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mtp_layers")


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
    "mtp_layers": 1 << 6,
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
    if len(f.problems) > before:
        return None
    return Model(**v)


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
        for key in (*dims, "q_lora_rank"):
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
