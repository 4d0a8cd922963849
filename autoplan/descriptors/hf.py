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

Mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3) map
onto Model's layout: the first ``dense_layers`` layers dense, every later one
sparse. A config whose dense layers fall elsewhere (``decoder_sparse_step``,
``mlp_only_layers``, ``moe_layer_freq``) is refused on that key rather than
approximated. Weights Model cannot express (biases on some projections only,
Qwen2-MoE's shared-expert gate) are named, with their size, where each family is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoplan.descriptors.model import Model, out_of_range, route_group_problem
from autoplan.descriptors.strict import MAX_NAME, Fields, shown
from autoplan.errors import InputError, Problem
from autoplan.text import one_line
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
        f.fail("model_type", f"unsupported model type {shown(model_type)}; supported: {_supported()}")
        raise InputError(problems)

    values = reader(f)
    if problems:
        raise InputError(problems)
    model = Model(name=name or _default_name(f, source), **values)
    for key, message in out_of_range(model):
        f.fail(_HF_KEYS.get(key, key), message)
    if problems:
        raise InputError(problems)
    return model


# a Model field and the config.json key most families read it from (for messages)
_HF_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
            "ffn_hidden": "intermediate_size", "vocab": "vocab_size",
            "max_seq_len": "max_position_embeddings", "top_k": "num_experts_per_tok",
            "moe_ffn_hidden": "moe_intermediate_size"}


# -- families ----------------------------------------------------------------------


def _read_llama_like(
    f: Fields,
    *,
    kv_heads_class_default: int | None,
    bias: bool | None,
    head_dim_class_default: int | None = None,
    intermediate_size_required: bool = True,
) -> dict[str, Any]:
    """Llama, Mistral, Qwen2/3 and the MoE families built on them: pre-norm RMSNorm,
    RoPE, gated MLP, optional GQA.

    ``kv_heads_class_default`` is the family config class's fixed default for
    ``num_key_value_heads``; None where the class derives it from
    ``num_attention_heads``. ``head_dim_class_default`` likewise for ``head_dim``
    (None: derived from hidden_size // num_attention_heads). ``bias`` None lets
    ``attention_bias``/``mlp_bias`` decide. With ``intermediate_size_required``
    False a missing ``intermediate_size`` leaves ``ffn_hidden`` None for the
    caller (an MoE family whose dense MLP width matters only if some layer is dense).
    """
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    if kv_heads_class_default is None or f.has("num_key_value_heads"):
        kv_heads = f.int("num_key_value_heads", heads, min=1)
    else:
        # A fixed class default is the flagship model's value: refuse to assume it.
        kv_heads = None
        _fail_flagship_default(f, "num_key_value_heads", kv_heads_class_default, "num_attention_heads")
    if head_dim_class_default is None or f.has("head_dim"):
        head_dim = f.int("head_dim", None, min=1)
    else:
        head_dim = None
        _fail_flagship_default(f, "head_dim", head_dim_class_default, "hidden_size // num_attention_heads")
    if intermediate_size_required:
        ffn_hidden = f.int("intermediate_size", min=1)
    else:
        ffn_hidden = f.int("intermediate_size", None, min=1)
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
    # Qwen2 (and Qwen2.5) has biases on q/k/v only (Qwen2Attention: q_proj, k_proj,
    # v_proj bias=True, o_proj and the MLP without): Model.qkv_bias.
    values = _read_llama_like(f, kv_heads_class_default=32, bias=False)
    return {**values, "qkv_bias": True}


def _read_qwen3(f: Fields) -> dict[str, Any]:
    # Qwen3Config defaults num_key_value_heads to 32 and head_dim to 128: fixed
    # values, not derived, so both are required. Qwen3Attention applies an RMSNorm
    # of head_dim to every query and key head (q_norm, k_norm). attention_bias
    # (default False) biases q/k/v/o and never the MLP, so Model.bias is False
    # either way; with attention_bias true the count misses
    # (heads + 2 * kv_heads) * head_dim + hidden_size per layer.
    values = _read_llama_like(f, kv_heads_class_default=32, bias=False, head_dim_class_default=128)
    return {**values, "qk_norm": True}


# -- mixtures of experts -------------------------------------------------------------


def _read_mixtral(f: Fields) -> dict[str, Any]:
    """Mixtral: Mistral's attention; every MLP is a sparse block of num_local_experts
    SwiGLU experts of width intermediate_size, num_experts_per_tok of them per token,
    chosen by one bias-free hidden_size -> num_local_experts router."""
    # MixtralConfig defaults num_key_value_heads to 8, num_local_experts to 8 and
    # num_experts_per_tok to 2: Mixtral-8x7B's values, so all three are required.
    values = _read_llama_like(f, kv_heads_class_default=8, bias=False)
    experts = f.int("num_local_experts", min=1)
    top_k = f.int("num_experts_per_tok", min=1)
    _check_routing(f, experts, top_k, experts_key="num_local_experts")
    # intermediate_size is the width of one expert: moe_ffn_hidden 0 means ffn_hidden.
    return {**values, "experts": experts, "top_k": top_k}


def _read_qwen2_moe(f: Fields) -> dict[str, Any]:
    """Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention; each sparse MLP has
    num_experts routed experts of moe_intermediate_size, num_experts_per_tok per token,
    and one shared expert of shared_expert_intermediate_size that every token uses."""
    # Qwen2MoeConfig defaults num_key_value_heads to 16 and the expert sizes to
    # Qwen1.5-MoE-A2.7B's values, so they are required.
    # Two small weights are not counted. (1) Biases on q/k/v only (qkv_bias, default
    # true; o_proj and the experts have none): Model.bias means every linear layer,
    # so it is False and (heads + 2 * kv_heads) * head_dim per layer are missed.
    # (2) shared_expert_gate, a bias-free hidden_size -> 1 linear layer scaling the
    # shared expert's output in every sparse layer: hidden_size per sparse layer.
    # Together 8,192 per layer for Qwen1.5-MoE-A2.7B, 196,608 of its 14.3 billion.
    return _read_qwen_moe(f, kv_heads_class_default=16, shared_expert=True, qk_norm=False)


def _read_qwen3_moe(f: Fields) -> dict[str, Any]:
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with per-head Q/K
    RMSNorm; each sparse MLP has num_experts routed experts of moe_intermediate_size,
    num_experts_per_tok per token, and no shared expert."""
    # Qwen3MoeConfig defaults num_key_value_heads to 4 (fixed: required). Its
    # attention reads head_dim with getattr(config, "head_dim", hidden_size //
    # num_attention_heads), so a missing head_dim is derived. attention_bias
    # (default False) biases q/k/v/o only: see _read_qwen3 for what it misses.
    return _read_qwen_moe(f, kv_heads_class_default=4, shared_expert=False, qk_norm=True)


def _read_qwen_moe(
    f: Fields, *, kv_heads_class_default: int, shared_expert: bool, qk_norm: bool
) -> dict[str, Any]:
    values = _read_llama_like(
        f, kv_heads_class_default=kv_heads_class_default, bias=False, intermediate_size_required=False
    )
    experts = f.int("num_experts", min=1)
    top_k = f.int("num_experts_per_tok", min=1)
    moe_ffn = f.int("moe_intermediate_size", min=1)
    shared_ffn = f.int("shared_expert_intermediate_size", min=0) if shared_expert else 0
    _check_routing(f, experts, top_k, experts_key="num_experts")
    dense_layers = _qwen_dense_layers(f, values["layers"])
    why = "decoder_sparse_step, mlp_only_layers"
    ffn_hidden = _dense_width(f, values["ffn_hidden"], dense_layers, moe_ffn, why)
    return {
        **values,
        "ffn_hidden": ffn_hidden,
        "qk_norm": qk_norm,
        "experts": experts,
        "top_k": top_k,
        "moe_ffn_hidden": moe_ffn,
        "shared_experts": 1 if shared_ffn else 0,
        "shared_ffn_hidden": shared_ffn,
        "dense_layers": dense_layers,
    }


def _qwen_dense_layers(f: Fields, layers: int | None) -> int | None:
    """How many leading layers Qwen2/3-MoE keep dense; a problem where it is no leading block.

    Qwen2MoeDecoderLayer and Qwen3MoeDecoderLayer use the sparse block where
    ``layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0``
    and a dense MLP of intermediate_size elsewhere. Model keeps the first
    dense_layers dense and every later layer sparse, so other patterns are refused
    rather than approximated (they change both the count and each stage's work).
    """
    step = f.int("decoder_sparse_step", 1, min=1)
    only_raw = f.raw("mlp_only_layers", [])
    only = () if only_raw == [] else f.int_list("mlp_only_layers", min=0)
    if layers is None or step is None or only is None:
        return None
    beyond = sorted(i for i in set(only) if i >= layers)
    if beyond:
        f.fail("mlp_only_layers", f"expected layer indices below num_hidden_layers ({layers}), got {beyond}")
        return None
    dense = [i for i in range(layers) if i in only or (i + 1) % step]
    key = "decoder_sparse_step" if step != 1 else "mlp_only_layers"
    pattern = f"(decoder_sparse_step {step}, mlp_only_layers {list(only)})"
    if len(dense) == layers:
        f.fail(key, f"leaves no mixture-of-experts layer {pattern}; import it as a dense model")
        return None
    if dense != list(range(len(dense))):
        f.fail(
            key,
            f"dense layers {_indices(dense)} are not a leading block {pattern}: autoplan models "
            f"the first k layers dense and every later one mixture-of-experts, and cannot "
            f"represent this pattern",
        )
        return None
    return len(dense)


def _route_groups(f: Fields, experts: int | None, top_k: int | None) -> tuple[int, int]:
    """DeepSeek's group-limited routing: topk_method group_limited_greedy (V2, "device-
    limited routing", Sec. 2.2.3) or noaux_tc (V3, "node-limited routing", Sec. 2.1.2)
    picks each token's experts among its topk_group best of n_group groups; greedy
    (V2-Lite) routes over all experts; transformers' DeepseekV3 has no topk_method and
    always limits. (0, 0) where routing is unrestricted."""
    method = f.str("topk_method", "noaux_tc")
    # 0 in a config: no groups, as absent (configs are the model's, written by others)
    groups = f.int("n_group", 0, min=0)
    group_topk = f.int("topk_group", 0, min=0)
    if method == "greedy" or not groups or not group_topk or groups == 1:
        return 0, 0
    if experts is None or top_k is None:
        return 0, 0
    problem = route_group_problem(experts, top_k, groups, group_topk)
    if problem is None:
        return groups, group_topk
    f.fail("n_group" if problem[0] == "groups" else "topk_group", problem[1])
    return 0, 0


def _read_deepseek(f: Fields) -> dict[str, Any]:
    """DeepSeek-V2 and -V3: multi-head latent attention (MLA), first_k_dense_replace
    dense layers, then DeepSeekMoE layers of n_routed_experts routed experts
    (num_experts_per_tok per token) and n_shared_experts shared ones, all of width
    moe_intermediate_size; V3 adds num_nextn_predict_layers multi-token-prediction
    modules.

    Keys are those of transformers' DeepseekV3Config and of the checkpoints' own
    configuration_deepseek.py (V2 and V3 share them). Two small weights are not
    counted: attention_bias (default false) would bias q_a/kv_a/o projections, which
    Model's MLA count leaves out; and V3's router (topk_method noaux_tc) keeps an
    e_score_correction_bias of n_routed_experts per sparse layer, 14,848 for
    DeepSeek-V3 (256 x 58).
    """
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    # Both config classes turn num_key_value_heads None into num_attention_heads.
    # MLA decompresses one key and one value per head, so nothing else is meaningful.
    kv_heads = f.int("num_key_value_heads", heads, min=1)
    if heads is not None and kv_heads is not None and kv_heads != heads:
        f.fail(
            "num_key_value_heads",
            f"multi-head latent attention has one key and value per head: expected "
            f"num_attention_heads ({heads}), got {kv_heads}",
        )
    vocab = f.int("vocab_size", min=1)
    max_seq_len = f.int("max_position_embeddings", min=1)
    activation = _activation(f, "hidden_act", "silu", gated=True)
    tied = f.bool("tie_word_embeddings", False)
    attention_dropout = f.float("attention_dropout", 0.0, min=0.0, max=1.0)
    # MLA. q_lora_rank null (DeepSeek-V2-Lite) projects queries directly; its class
    # default (1536) is DeepSeek-V3's value, so the key must be there.
    q_lora_rank = _int_or_null(f, "q_lora_rank", min=1)
    kv_lora_rank = f.int("kv_lora_rank", min=1)
    qk_nope_head_dim = f.int("qk_nope_head_dim", min=1)
    qk_rope_head_dim = f.int("qk_rope_head_dim", min=1)
    v_head_dim = f.int("v_head_dim", min=1)
    # DeepSeekMoE. Every class default here is a flagship value: all required.
    experts = f.int("n_routed_experts", min=1)
    top_k = f.int("num_experts_per_tok", min=1)
    moe_ffn = f.int("moe_intermediate_size", min=1)
    # V2's code builds shared experts only when n_shared_experts is not null.
    shared = _int_or_null(f, "n_shared_experts", min=0)
    first_k_dense = f.int("first_k_dense_replace", min=0)
    # The sparse block goes where layer_idx >= first_k_dense_replace and
    # layer_idx % moe_layer_freq == 0 (class default 1: every such layer).
    moe_layer_freq = f.int("moe_layer_freq", 1, min=1)
    if moe_layer_freq is not None and moe_layer_freq != 1:
        f.fail(
            "moe_layer_freq",
            f"expected 1, got {moe_layer_freq}: dense layers between the sparse ones cannot be "
            f"represented (autoplan models the first first_k_dense_replace layers dense and "
            f"every later one mixture-of-experts)",
        )
    # transformers' DeepseekV3Config has no num_nextn_predict_layers and builds no
    # MTP module; V2 has none. A file without the key describes a model without one.
    mtp_layers = f.int("num_nextn_predict_layers", 0, min=0)
    _check_routing(f, experts, top_k, experts_key="n_routed_experts")
    groups, group_topk = _route_groups(f, experts, top_k)
    if first_k_dense is not None and layers is not None and first_k_dense >= layers:
        f.fail(
            "first_k_dense_replace",
            f"expected fewer than num_hidden_layers ({layers}), got {first_k_dense}",
        )
        first_k_dense = None
    ffn_hidden = f.int("intermediate_size", None, min=1)
    ffn_hidden = _dense_width(f, ffn_hidden, first_k_dense, moe_ffn, "first_k_dense_replace")
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
        norm=Norm.RMSNORM,
        bias=False,
        dropout=bool(attention_dropout),
        experts=experts,
        top_k=top_k,
        moe_ffn_hidden=moe_ffn,
        shared_experts=shared,
        dense_layers=first_k_dense,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=kv_lora_rank,
        qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=v_head_dim,
        mtp_layers=mtp_layers,
        route_groups=groups,
        route_group_topk=group_topk,
    )


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
    "deepseek_v2": _read_deepseek,
    "deepseek_v3": _read_deepseek,
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
    "llama": _read_llama,
    "mistral": _read_mistral,
    "mixtral": _read_mixtral,
    "qwen2": _read_qwen2,
    "qwen2_moe": _read_qwen2_moe,
    "qwen3": _read_qwen3,
    "qwen3_moe": _read_qwen3_moe,
}


# -- helpers -----------------------------------------------------------------------


def _supported() -> str:
    return ", ".join(sorted(_READERS))


def _fail_flagship_default(f: Fields, key: str, class_default: int, instead: str) -> None:
    f.fail(
        key,
        f"missing required field (transformers would assume {class_default}, not {instead}; "
        f"give it explicitly)",
    )


def _int_or_null(f: Fields, key: str, *, min: int) -> int | None:
    """A key that must be present, whose null means none (0)."""
    if key not in f.data:
        f.fail(key, "missing required field (null if the model has none)")
        return None
    return f.int(key, 0, min=min)


def _check_routing(f: Fields, experts: int | None, top_k: int | None, *, experts_key: str) -> None:
    if experts is not None and top_k is not None and top_k > experts:
        f.fail("num_experts_per_tok", f"expected at most {experts_key} ({experts}), got {top_k}")


def _dense_width(
    f: Fields, ffn_hidden: int | None, dense_layers: int | None, moe_ffn: int | None, why: str
) -> int | None:
    """intermediate_size, needed only where some layer is dense; else the expert width
    stands in (Model wants a width, and no layer uses it)."""
    if ffn_hidden is not None or f.has("intermediate_size"):
        return ffn_hidden
    if dense_layers:
        f.fail("intermediate_size", f"missing required field: the {dense_layers} dense layers ({why}) use it")
        return None
    return moe_ffn


def _indices(values: list[int], shown: int = 8) -> str:
    head = ", ".join(str(v) for v in values[:shown])
    return f"[{head}, ...]" if len(values) > shown else f"[{head}]"


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
    f.fail(key, f"expected one of {', '.join(accepted)} ({kind} MLP), got {shown(act)}")
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
    """``_name_or_path`` (checked as every name is: ``Fields.name``), else the file's
    (its folder's for config.json), with characters no name may hold made spaces."""
    if isinstance(f.data.get("_name_or_path"), str) and f.data["_name_or_path"].strip():
        name = f.name("_name_or_path")
        if isinstance(name, str):
            return name.strip()
    path = Path(source)
    # Hub downloads are all called config.json; their folder names the model.
    raw = path.parent.name if path.stem == "config" and path.parent.name else (path.stem or source)
    return one_line(raw)[:MAX_NAME].strip() or "model"


# config.json keys that change the architecture in ways the cost model does not follow:
# attention over a window or in chunks costs less than the full causal attention counted
UNMODELLED = {
    "sliding_window": "sliding-window attention (counted as full causal attention)",
    "attention_chunk_size": "chunked attention (counted as full causal attention)",
    "layer_types": "per-layer attention types (every layer counted as full attention)",
}


def import_notes(data: Any, model: Model, label: str) -> list[str]:
    """What was imported from a config.json, and what of it is not modelled."""
    kv = f" ({model.kv_heads} kv)" if model.kv_heads != model.heads else ""
    experts = f", {model.experts} experts (top {model.top_k})" if model.is_moe else ""
    notes = [f"imported {label} ({data.get('model_type')}): {model.layers} layers, hidden "
             f"{model.hidden}, {model.heads} heads{kv}{experts}, "
             f"{model.params_total / 1e9:.2f}B parameters"]
    for key, what in UNMODELLED.items():
        value = data.get(key)
        if value is None or (key == "sliding_window" and data.get("use_sliding_window") is False):
            continue
        notes.append(f"{label}: {key} is not modelled: {what}")
    return notes
