"""The application: a decoder-only transformer's architecture."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from autoplan.descriptors.strict import Fields
from autoplan.vocab import Activation, Norm, Position


@dataclass(frozen=True, slots=True, kw_only=True)
class Model:
    """A decoder-only transformer, in the field names of DESIGN.md.

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
        """Q, K, V and output projections (+ biases)."""
        weights = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        biases = self.q_dim + 2 * self.kv_dim + self.hidden if self.bias else 0
        return weights + biases

    @property
    def params_mlp(self) -> int:
        weights = self.mlp_matrices * self.hidden * self.ffn_hidden
        up = (self.mlp_matrices - 1) * self.ffn_hidden
        biases = up + self.hidden if self.bias else 0
        return weights + biases

    @property
    def params_layer(self) -> int:
        """One transformer layer: attention, MLP and its two norms."""
        return self.params_attention + self.params_mlp + 2 * self.params_norm

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
        return self.layers * self.params_layer + self.params_embedding + self.params_output

    @property
    def params_active(self) -> int:
        """Parameters touched per token; equals the total for dense models."""
        return self.params_total

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
        return out


def read_model(f: Fields) -> Model | None:
    """Build a Model from the mapping under ``model:``; None when problems were recorded."""
    before = len(f.problems)
    values = dict(
        name=f.str("name"),
        layers=f.int("layers", min=1),
        hidden=f.int("hidden", min=1),
        heads=f.int("heads", min=1),
        kv_heads=f.int("kv_heads", min=1),
        ffn_hidden=f.int("ffn_hidden", min=1),
        vocab=f.int("vocab", min=1),
        activation=f.enum("activation", Activation),
        position=f.enum("position", Position),
        tied_embeddings=f.bool("tied_embeddings"),
        max_seq_len=f.int("max_seq_len", min=1),
        norm=f.enum("norm", Norm, Norm.RMSNORM),
        bias=f.bool("bias", False),
        dropout=f.bool("dropout", False),
        head_dim=f.int("head_dim", 0, min=0),
    )
    f.close()
    if len(f.problems) > before:
        return None
    heads, kv_heads, hidden, head_dim = (
        values["heads"],
        values["kv_heads"],
        values["hidden"],
        values["head_dim"],
    )
    if heads % kv_heads:
        f.fail("kv_heads", f"expected a divisor of heads ({heads}), got {kv_heads}")
    if not head_dim and hidden % heads:
        f.fail("heads", f"expected a divisor of hidden ({hidden}) or an explicit head_dim")
    if len(f.problems) > before:
        return None
    return Model(**values)


def _cache_hash(obj: object) -> None:
    """Frozen descriptors are hashed on every memoized cost lookup: hash them once."""
    values = tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.compare)  # type: ignore[arg-type]
    object.__setattr__(obj, "_hash", hash(values))
