"""Read a HuggingFace ``config.json`` as a :class:`Model`.

Every architecture fact is read from the config under the name transformers
gives it; nothing is inferred from ratios (a Llama with an unusual
``intermediate_size`` is still a gated SwiGLU MLP because its ``hidden_act``
and family say so). Keys autoplan does not need are ignored: a config.json
carries dozens (token ids, rope scaling, dtype, generation settings).

Defaults follow each family's transformers configuration class
(``configuration_<family>.py``) where the class default is a flag or is
derived from other keys (``tie_word_embeddings``, ``attention_bias``,
``num_key_value_heads`` of Llama, ``n_inner`` of GPT-2). Sizes whose class
default is merely the flagship model's value (``hidden_size: 4096``) are
required: a file that leaves them out is broken, and guessing would plan for a
different model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoplan.descriptors.model import Model
from autoplan.descriptors.strict import Fields
from autoplan.errors import InputError, Problem
from autoplan.vocab import Activation, Norm, Position

# transformers' ACT2FN names for GELU and its approximations (activations.py).
_GELU_NAMES = frozenset(
    {
        "gelu",
        "gelu_new",
        "gelu_fast",
        "gelu_pytorch_tanh",
        "gelu_accurate",
        "gelu_python",
        "gelu_10",
        "quick_gelu",
    }
)
_SILU_NAMES = frozenset({"silu", "swish"})


def is_hf_config(data: Any) -> bool:
    """True when ``data`` looks like a HuggingFace config.json, not an autoplan descriptor."""
    return isinstance(data, Mapping) and ("model_type" in data or "architectures" in data)


def model_from_hf_config(data: Any, source: str, name: str | None = None) -> Model:
    """Build a :class:`Model` from a parsed HuggingFace ``config.json``.

    ``source`` names the file in error messages. The model is called ``name``,
    else the config's ``_name_or_path``, else after the file (its folder when
    the file is the usual ``config.json``). Every problem in the file is
    reported in one :class:`InputError`.
    """
    problems: list[Problem] = []
    f = Fields(data, source, "", problems)
    if not f.ok:
        raise InputError(problems)
    if not f.has("model_type"):
        f.fail(
            "model_type",
            f"missing required field; a HuggingFace config.json names its family here "
            f"(supported: {_supported()})",
        )
        raise InputError(problems)
    model_type = f.str("model_type")
    if model_type is None:
        raise InputError(problems)
    reader = _READERS.get(model_type)
    if reader is None:
        f.fail("model_type", f"unsupported model type {model_type!r}; supported: {_supported()}")
        raise InputError(problems)

    values = reader(f)
    if problems:
        raise InputError(problems)
    return Model(name=name or _default_name(f, source), **values)


# -- families ----------------------------------------------------------------------


def _read_llama_like(
    f: Fields, *, kv_heads_class_default: int | None, bias: bool | None
) -> dict[str, Any]:
    """Llama, Mistral and Qwen2: pre-norm RMSNorm, RoPE, gated MLP, optional GQA.

    ``kv_heads_class_default`` is the family config class's fixed default for
    ``num_key_value_heads``; None where the class derives it from
    ``num_attention_heads``. ``bias`` None lets ``attention_bias``/``mlp_bias`` decide.
    """
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    if kv_heads_class_default is None or f.has("num_key_value_heads"):
        kv_heads = f.int("num_key_value_heads", heads, min=1)
    else:
        # A fixed class default is the flagship model's value: refuse to assume it.
        kv_heads = None
        f.fail(
            "num_key_value_heads",
            f"missing required field (transformers would assume {kv_heads_class_default}, "
            f"not num_attention_heads; give it explicitly)",
        )
    head_dim = f.int("head_dim", None, min=1)
    ffn_hidden = f.int("intermediate_size", min=1)
    vocab = f.int("vocab_size", min=1)
    max_seq_len = f.int("max_position_embeddings", min=1)
    # The MLP is gate_proj/up_proj/down_proj whatever the activation, so it is gated.
    activation = _activation(f, "hidden_act", "silu", gated=True)
    tied = f.bool("tie_word_embeddings", False)
    if bias is None:
        # LlamaAttention puts attention_bias on q/k/v/o, LlamaMLP mlp_bias on
        # gate/up/down. Model.bias means every linear layer has one, so with one
        # group biased it is False and the count misses one vector per biased
        # projection (thousands of parameters next to matrices of millions).
        attention_bias = f.bool("attention_bias", False)
        mlp_bias = f.bool("mlp_bias", False)
        bias = bool(attention_bias and mlp_bias)
    attention_dropout = f.float("attention_dropout", 0.0, min=0.0, max=1.0)
    _check_heads(
        f,
        hidden,
        heads,
        kv_heads,
        head_dim,
        keys=("hidden_size", "num_attention_heads", "num_key_value_heads"),
        has_head_dim=True,
    )
    return dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=ffn_hidden,
        vocab=vocab,
        activation=activation,
        position=Position.ROPE,
        tied_embeddings=tied,
        max_seq_len=max_seq_len,
        norm=Norm.RMSNORM,
        bias=bias,
        dropout=bool(attention_dropout),
        head_dim=_explicit_head_dim(hidden, heads, head_dim),
    )


def _read_llama(f: Fields) -> dict[str, Any]:
    # LlamaConfig: num_key_value_heads None -> num_attention_heads (plain MHA).
    return _read_llama_like(f, kv_heads_class_default=None, bias=None)


def _read_mistral(f: Fields) -> dict[str, Any]:
    # MistralConfig defaults num_key_value_heads to 8 (Mistral-7B's value).
    # Mistral's linear layers carry no biases and the config has no switch for them.
    return _read_llama_like(f, kv_heads_class_default=8, bias=False)


def _read_qwen2(f: Fields) -> dict[str, Any]:
    # Qwen2Config defaults num_key_value_heads to 32.
    # Qwen2 has biases on q/k/v only; o_proj and the MLP have none. Model.bias is
    # one flag for all linear layers, so it is False and the q/k/v biases,
    # (heads + 2 * kv_heads) * head_dim per layer, are not counted: 129,024
    # parameters of Qwen2-7B's 7.6 billion (0.002 %). True would overcount by
    # more (o_proj and MLP biases, 1.26 million for Qwen2-7B).
    return _read_llama_like(f, kv_heads_class_default=32, bias=False)


def _read_gpt2(f: Fields) -> dict[str, Any]:
    """GPT-2: LayerNorm, learned positions, biases everywhere, tied LM head."""
    layers = f.int("n_layer", min=1)
    hidden = f.int("n_embd", min=1)
    heads = f.int("n_head", min=1)
    # GPT2Config: n_inner None -> 4 * n_embd.
    n_inner = f.int("n_inner", None, min=1)
    vocab = f.int("vocab_size", min=1)
    max_seq_len = f.int("n_positions", min=1)
    activation = _activation(f, "activation_function", "gelu_new", gated=False)
    # tie_word_embeddings is a PretrainedConfig default (True) GPT2Config keeps.
    tied = f.bool("tie_word_embeddings", True)
    # GPT2Config defaults all three dropouts to 0.1. resid_pdrop follows the
    # attention and MLP outputs, attn_pdrop the attention probabilities.
    resid_pdrop = f.float("resid_pdrop", 0.1, min=0.0, max=1.0)
    attn_pdrop = f.float("attn_pdrop", 0.1, min=0.0, max=1.0)
    _check_heads(
        f, hidden, heads, heads, None, keys=("n_embd", "n_head", "n_head"), has_head_dim=False
    )
    return dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        ffn_hidden=n_inner if n_inner is not None or hidden is None else 4 * hidden,
        vocab=vocab,
        activation=activation,
        position=Position.LEARNED,
        tied_embeddings=tied,
        max_seq_len=max_seq_len,
        norm=Norm.LAYERNORM,
        bias=True,
        dropout=bool(resid_pdrop or attn_pdrop),
    )


def _read_gpt_neox(f: Fields) -> dict[str, Any]:
    """GPT-NeoX (NeoX-20B, Pythia): LayerNorm, RoPE, plain GELU MLP, untied head.

    ``rotary_pct`` < 1 rotates only part of each head; it has no weights, so it
    changes no parameter count. ``use_parallel_residual`` changes the data flow,
    not the weights (both layer norms exist either way).
    """
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    ffn_hidden = f.int("intermediate_size", min=1)
    vocab = f.int("vocab_size", min=1)
    max_seq_len = f.int("max_position_embeddings", min=1)
    activation = _activation(f, "hidden_act", "gelu", gated=False)
    tied = f.bool("tie_word_embeddings", False)
    # query_key_value and dense carry attention_bias (default True); the MLP's
    # dense_h_to_4h and dense_4h_to_h always have biases. See _read_llama_like
    # for why one unbiased group makes the flag False.
    bias = f.bool("attention_bias", True)
    # GPTNeoXConfig reads attention_dropout and hidden_dropout (default 0.0);
    # older files also carry attention_probs_dropout_prob/hidden_dropout_prob,
    # which transformers ignores, and so does autoplan.
    attention_dropout = f.float("attention_dropout", 0.0, min=0.0, max=1.0)
    hidden_dropout = f.float("hidden_dropout", 0.0, min=0.0, max=1.0)
    _check_heads(
        f,
        hidden,
        heads,
        heads,
        None,
        keys=("hidden_size", "num_attention_heads", "num_attention_heads"),
        has_head_dim=False,
    )
    return dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        ffn_hidden=ffn_hidden,
        vocab=vocab,
        activation=activation,
        position=Position.ROPE,
        tied_embeddings=tied,
        max_seq_len=max_seq_len,
        norm=Norm.LAYERNORM,
        bias=bool(bias),
        dropout=bool(attention_dropout or hidden_dropout),
    )


_READERS: dict[str, Callable[[Fields], dict[str, Any]]] = {
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
    "llama": _read_llama,
    "mistral": _read_mistral,
    "qwen2": _read_qwen2,
}


# -- helpers -----------------------------------------------------------------------


def _supported() -> str:
    return ", ".join(sorted(_READERS))


def _activation(f: Fields, key: str, default: str, *, gated: bool) -> Activation | None:
    """Map a transformers activation name; ``gated`` is the family's MLP structure."""
    act = f.str(key, default)
    if act is None:
        return None
    if gated and act in _SILU_NAMES:
        return Activation.SWIGLU
    if act in _GELU_NAMES:
        return Activation.GEGLU if gated else Activation.GELU
    if not gated and act == "relu2":
        return Activation.RELU2
    accepted = sorted(_SILU_NAMES | _GELU_NAMES) if gated else sorted(_GELU_NAMES | {"relu2"})
    kind = "gated" if gated else "plain"
    f.fail(key, f"expected one of {', '.join(accepted)} ({kind} MLP), got {act!r}")
    return None


def _check_heads(
    f: Fields,
    hidden: int | None,
    heads: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    *,
    keys: tuple[str, str, str],
    has_head_dim: bool,
) -> None:
    """The shape rules read_model applies to autoplan's own descriptors, on HF keys.

    ``keys`` names the family's hidden-size, head and KV-head keys.
    """
    hidden_key, heads_key, kv_key = keys
    if heads is not None and kv_heads is not None and heads % kv_heads:
        f.fail(kv_key, f"expected a divisor of {heads_key} ({heads}), got {kv_heads}")
    if hidden is not None and heads is not None and head_dim is None and hidden % heads:
        alternative = " (or set head_dim)" if has_head_dim else ""
        f.fail(
            heads_key, f"expected a divisor of {hidden_key} ({hidden}){alternative}, got {heads}"
        )


def _explicit_head_dim(hidden: int | None, heads: int | None, head_dim: int | None) -> int:
    """Model.head_dim: 0 unless the config sets one other than hidden // heads."""
    if head_dim is None or hidden is None or heads is None or head_dim * heads == hidden:
        return 0
    return head_dim


def _default_name(f: Fields, source: str) -> str:
    name_or_path = f.data.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path.strip():
        return name_or_path.strip()
    path = Path(source)
    # Hub downloads are all called config.json; their folder names the model.
    if path.stem == "config" and path.parent.name:
        return path.parent.name
    return path.stem or source
