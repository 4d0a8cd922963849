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

Families whose layers differ (Qwen3-Next and Qwen3.5's Gated DeltaNet layers, Kimi
Linear's KDA layers, Nemotron-H's Mamba-2 blocks, DeepSeek-V3.2 and GLM-5's sparse
attention, gpt-oss, Gemma 3 and Gemma 4's sliding windows, DeepSeek-V4's compressed
attention with its hyper-connections, Kimi-K3's attention residuals and latent experts) are
read into Model's per-layer kinds (``mixers``, ``mlps``); multimodal wrappers (Qwen3.5,
Qwen3-VL, Gemma 3, Gemma 4, Kimi-K2.5, Kimi-K3) read ``text_config`` with the text family's
reader, problems named under ``text_config.``, and ``vision_config`` into a
:class:`Vision`. Structure Model cannot represent is refused on the key that says so.

Mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3) map
onto Model's layout: the first ``dense_layers`` layers dense, every later one
sparse. A config whose dense layers fall elsewhere (``decoder_sparse_step``,
``mlp_only_layers``, ``moe_layer_freq``) is refused on that key rather than
approximated. Weights Model cannot express (biases on some projections only,
Qwen2-MoE's shared-expert gate) are named, with their size, where each family is read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoplan.descriptors.model import (
    CSA,
    DENSE,
    FULL,
    GDN,
    HCA,
    KDA,
    MAMBA,
    MOE,
    NO_MIXER,
    NO_MLP,
    SLIDING,
    SPARSE,
    VISION_LIMITS,
    Model,
    Vision,
    check_kinds,
    out_of_range,
    route_group_problem,
)
from autoplan.descriptors.strict import MAX_NAME, Fields, _type_name, shown
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
    reader = _READERS.get(model_type) or _REFUSED.get(model_type)
    if reader is None:
        f.fail("model_type", f"unsupported model type {shown(model_type)}; supported: {_supported()}")
        raise InputError(problems)

    values = reader(f)
    if problems:
        raise InputError(problems)
    model = Model(name=name or _default_name(f, source), **values)
    prefix = "text_config." if model_type in _WRAPPERS else ""
    for key, message in out_of_range(model):
        f.fail(prefix + _HF_KEYS.get(key, key), message)
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


# -- hybrid, sparse-attention and multimodal families --------------------------------
# Each layer's kind goes to Model.mixers / Model.mlps (one symbol per layer: model.py's
# FULL ... NO_MLP). Multimodal configs wrap the language model's keys in text_config and
# the image encoder's in vision_config; problems are named under those keys.

# Qwen3-Next / Qwen3.5 layer_types (configuration_qwen3_next.py: "linear_attention" is a
# Gated DeltaNet layer, "full_attention" gated softmax attention)
_QWEN_LAYER_TYPES = {"linear_attention": GDN, "full_attention": FULL}
# gpt-oss and Gemma 4 layer_types (configuration_gpt_oss.py, configuration_gemma4.py)
_SLIDING_LAYER_TYPES = {"sliding_attention": SLIDING, "full_attention": FULL}
# Nemotron-H blocks (configuration_nemotron_h.py _pattern_to_list, and the older names
# remap_legacy_layer_types maps: "mamba", "attention"): one mixer or one MLP per block
_NEMOTRON_BLOCKS = {"M": (MAMBA, NO_MLP), "*": (FULL, NO_MLP), "-": (NO_MIXER, DENSE),
                    "E": (NO_MIXER, MOE)}
_NEMOTRON_BLOCK_TYPES = {"linear_attention": "M", "mamba": "M", "full_attention": "*",
                         "attention": "*", "mlp": "-", "moe": "E"}


def _layer_pattern(f: Fields, key: str, layers: int | None, symbols: Mapping[str, str]) -> str | None:
    """A per-layer list of type names (``layer_types``) as one symbol per layer."""
    raw = f.raw(key)
    if raw is None:
        return None
    names = ", ".join(symbols)
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) for x in raw):
        f.fail(key, f"expected a non-empty list of layer type names ({names}), got {_type_name(raw)}")
        return None
    for i, name in enumerate(raw):
        if name not in symbols:
            f.fail(f"{key}[{i}]", f"unknown layer type {shown(name)}; expected one of {names}")
            return None
    if layers is not None and len(raw) != layers:
        f.fail(key, f"expected one entry per layer (num_hidden_layers {layers}), got {len(raw)}")
        return None
    return "".join(symbols[name] for name in raw)


def _sliding_mixers(mixers: str | None) -> str | None:
    """Model.mixers of a sliding-window family's pattern: "" where no layer slides (every
    layer full, the model's default); None where the pattern was refused, so that
    ``_check_kinds`` adds nothing to the problem already named."""
    if mixers is None:
        return None
    return mixers if SLIDING in mixers else ""


def _refuse_true(f: Fields, key: str, what: str, default: bool = False) -> None:
    """A switch whose true value adds weights or structure Model cannot represent."""
    if f.bool(key, default):
        f.fail(key, f"true is not supported: {what}")


def _refuse_given(f: Fields, key: str, what: str) -> None:
    """A key whose presence (non-null, non-zero) means structure Model cannot represent."""
    if f.raw(key, None) not in (None, 0, False, [], {}):
        f.fail(key, f"{what} is not modelled (expected no {key})")


def _check_kinds(f: Fields, values: dict[str, Any], keys: Mapping[str, str]) -> None:
    """model.check_kinds on a reader's values, each problem named by the HF key ``keys``
    maps its field to (the field's own name where none)."""
    if any(v is None for v in values.values()):
        return  # a problem is already recorded
    full = {fl.name: fl.default for fl in dataclasses.fields(Model)
            if fl.init and fl.default is not dataclasses.MISSING}
    full.update(values)
    check_kinds(lambda key, message: f.fail(keys.get(key, key), message), full)


def _sub_config(f: Fields, key: str, model_types: tuple[str, ...]) -> Fields | None:
    """A multimodal wrapper's ``text_config`` or ``vision_config``, its problems named
    under ``key``; its own model_type, where given, one of ``model_types``."""
    raw = f.raw(key)
    if raw is None:
        return None
    sub = f.child(key, raw)
    if not sub.ok:
        return None
    kind = sub.str("model_type", None)
    if kind is not None and kind not in model_types:
        sub.fail("model_type", f"expected {' or '.join(model_types)}, got {shown(kind)}")
        return None
    return sub


def _wrapper_tie(f: Fields, values: dict[str, Any], class_default: bool) -> dict[str, Any]:
    """A multimodal model's output head is tied as its top-level tie_word_embeddings says:
    Qwen3-VL-235B-A22B's text_config says true where the top level says false, and its
    checkpoint has lm_head.weight (docs/research issue 51, the safetensors inventory)."""
    return {**values, "tied_embeddings": f.bool("tie_word_embeddings", class_default)}


# .. Qwen3-Next, Qwen3.5 ..............................................................


def _read_qwen_hybrid(f: Fields, *, kv_heads_class_default: int, moe: bool,
                      sparse_step: bool) -> dict[str, Any]:
    """Qwen3-Next and Qwen3.5 text models (transformers configuration_qwen3_next.py,
    configuration_qwen3_5[_moe].py; modeling Qwen3NextGatedDeltaNet, Qwen3NextAttention):
    Gated DeltaNet layers (``linear_attention``) and gated full-attention layers
    (``full_attention``: q_proj doubled for the per-channel output gate, q/k RMSNorm of
    head_dim), as layer_types says or, without it, every full_attention_interval-th
    layer full; MoE with one gated shared expert, or a dense MLP."""
    # every size's class default is the flagship's (head_dim 256, num_key_value_heads
    # 2 or 4, linear_* 16/32 heads of 128): all required
    values = _read_llama_like(f, kv_heads_class_default=kv_heads_class_default, bias=False,
                              head_dim_class_default=256, intermediate_size_required=not moe)
    _refuse_true(f, "attention_bias", "biases on q, k, v and o only (Model biases every linear "
                                      "layer or only q, k, v)")
    layers = values["layers"]
    if f.has("layer_types"):
        mixers = _layer_pattern(f, "layer_types", layers, _QWEN_LAYER_TYPES)
    else:
        # the class derives layer_types from full_attention_interval (default 4, the
        # flagship's: required)
        interval = f.int("full_attention_interval", min=1)
        mixers = (None if interval is None or layers is None else
                  "".join(GDN if (i + 1) % interval else FULL for i in range(layers)))
    linear: dict[str, Any] = {}
    if mixers is None or GDN in mixers:
        linear = {"linear_heads": f.int("linear_num_value_heads", min=1),
                  "linear_key_heads": f.int("linear_num_key_heads", min=1),
                  "linear_key_dim": f.int("linear_key_head_dim", min=1),
                  "linear_value_dim": f.int("linear_value_head_dim", min=1),
                  "conv_kernel": f.int("linear_conv_kernel_dim", min=1)}
    # transformers always gates the output (Qwen3NextAttention); vLLM reads
    # attn_output_gate, default true (vllm/model_executor/models/qwen3_next.py)
    gate = f.bool("attn_output_gate", True)
    values = {**values, **linear, "mixers": mixers, "qk_norm": True, "attn_output_gate": gate}
    if moe:
        experts = f.int("num_experts", min=1)
        top_k = f.int("num_experts_per_tok", min=1)
        moe_ffn = f.int("moe_intermediate_size", min=1)
        shared_ffn = f.int("shared_expert_intermediate_size", min=0)
        _check_routing(f, experts, top_k, experts_key="num_experts")
        # Qwen3-Next keeps Qwen3-MoE's decoder_sparse_step / mlp_only_layers; Qwen3.5's
        # decoder layers are all sparse (its config class has neither key)
        dense = _qwen_dense_layers(f, layers) if sparse_step else 0
        why = "decoder_sparse_step, mlp_only_layers"
        values.update(
            ffn_hidden=_dense_width(f, values["ffn_hidden"], dense, moe_ffn, why),
            experts=experts, top_k=top_k, moe_ffn_hidden=moe_ffn, dense_layers=dense,
            shared_experts=1 if shared_ffn else 0, shared_ffn_hidden=shared_ffn,
            # shared_expert_gate: a bias-free hidden -> 1 sigmoid gate on the shared expert
            shared_expert_gate=bool(shared_ffn))
    _check_kinds(f, values, _QWEN_HYBRID_KEYS)
    return values


_QWEN_HYBRID_KEYS = {"mixers": "layer_types", "linear_heads": "linear_num_value_heads",
                     "linear_key_heads": "linear_num_key_heads",
                     "linear_key_dim": "linear_key_head_dim",
                     "linear_value_dim": "linear_value_head_dim",
                     "conv_kernel": "linear_conv_kernel_dim", "experts": "num_experts"}


def _read_qwen3_next(f: Fields) -> dict[str, Any]:
    """Qwen3-Next (Qwen3-Next-80B-A3B): 3 Gated DeltaNet layers to 1 gated attention
    layer, 512 experts and a gated shared expert, one MTP layer."""
    values = _read_qwen_hybrid(f, kv_heads_class_default=2, moe=True, sparse_step=True)
    # The checkpoint holds one MTP layer (mtp.*: a full-attention MoE layer, fc, three
    # norms) the config does not mention; vLLM's Qwen3NextMTP reads
    # num_nextn_predict_layers, default 1 (vllm/model_executor/models/qwen3_next_mtp.py).
    return {**values, "mtp_layers": f.int("num_nextn_predict_layers", 1, min=0)}


def _qwen3_5_text(f: Fields, *, moe: bool) -> dict[str, Any]:
    values = _read_qwen_hybrid(f, kv_heads_class_default=2 if moe else 4, moe=moe,
                               sparse_step=False)
    # vLLM's Qwen3_5MTP builds mtp_num_hidden_layers full-attention layers sharing the
    # embedding and head; transformers' config class has no such key (no MTP): 0
    mtp = f.int("mtp_num_hidden_layers", 0, min=0)
    _refuse_true(f, "mtp_use_dedicated_embeddings", "MTP layers with their own embedding table")
    return {**values, "mtp_layers": mtp}


def _read_qwen3_5_moe(f: Fields) -> dict[str, Any]:
    """Qwen3.5 MoE (Qwen3.5-397B-A17B): the Qwen3-Next layers under text_config, a
    Qwen3-VL vision tower (without DeepStack) under vision_config."""
    return _qwen3_5(f, moe=True)


def _read_qwen3_5(f: Fields) -> dict[str, Any]:
    """Qwen3.5 dense (Qwen3.5-27B): as Qwen3.5 MoE with a dense SwiGLU MLP."""
    return _qwen3_5(f, moe=False)


def _qwen3_5(f: Fields, *, moe: bool) -> dict[str, Any]:
    kind = "qwen3_5_moe" if moe else "qwen3_5"
    text = _sub_config(f, "text_config", (f"{kind}_text",))
    values = _qwen3_5_text(text, moe=moe) if text is not None else {}
    vision_fields = _sub_config(f, "vision_config", (kind, f"{kind}_vision"))
    vision = (_qwen_vision(vision_fields, values.get("hidden"), deepstack=False)
              if vision_fields is not None else None)
    # Qwen3_5(Moe)Config.tie_word_embeddings defaults to false
    return {**_wrapper_tie(f, values, False), "vision": vision}


# Qwen3-VL / Qwen3.5 vision towers: GELU (tanh) MLP blocks, every linear layer biased,
# LayerNorm (transformers Qwen3VLVisionModel: patch_embed Conv3d with bias, pos_embed,
# blocks, merger; Qwen3-VL adds one DeepStack merger per deepstack_visual_indexes entry)
def _qwen_vision(v: Fields, text_hidden: int | None, *, deepstack: bool) -> Vision | None:
    before = len(v.problems)
    # every class default is the flagship's (depth 27, hidden 1152, out_hidden 3584 ...)
    values = {
        "layers": v.int("depth", min=1, max=VISION_LIMITS["layers"]),
        "hidden": v.int("hidden_size", min=1, max=VISION_LIMITS["hidden"]),
        "heads": v.int("num_heads", min=1, max=VISION_LIMITS["heads"]),
        "ffn_hidden": v.int("intermediate_size", min=1, max=VISION_LIMITS["ffn_hidden"]),
        "patch_size": v.int("patch_size", min=1, max=VISION_LIMITS["patch_size"]),
        "out_hidden": v.int("out_hidden_size", min=1, max=VISION_LIMITS["out_hidden"]),
        "merge": v.int("spatial_merge_size", min=1, max=VISION_LIMITS["merge"]),
        "temporal_patch": v.int("temporal_patch_size", min=1, max=VISION_LIMITS["temporal_patch"]),
        # 3 (RGB) is what every config class says
        "channels": v.int("in_channels", 3, min=1, max=VISION_LIMITS["channels"]),
        "positions": v.int("num_position_embeddings", min=1, max=VISION_LIMITS["positions"]),
    }
    if deepstack:
        # Qwen3VLVisionConfig's default [8, 16, 24] is the flagship's: required
        indexes = v.raw("deepstack_visual_indexes")
        if indexes is not None and not isinstance(indexes, list):
            v.fail("deepstack_visual_indexes", f"expected a list of block indices, got {_type_name(indexes)}")
        values["deepstack"] = len(indexes) if isinstance(indexes, list) else None
    _plain_gelu(v, "hidden_act", "gelu_pytorch_tanh")
    _vision_shape(v, values, text_hidden, heads_key="num_heads", out_key="out_hidden_size")
    if len(v.problems) > before:
        return None
    return Vision(**values, gated=False, norm=Norm.LAYERNORM, bias=True, projector="mlp")


def _plain_gelu(v: Fields, key: str, default: str) -> None:
    act = v.str(key, default)
    if act is not None and act not in _GELU_NAMES:
        v.fail(key, f"expected a GELU ({', '.join(sorted(_GELU_NAMES))}), got {shown(act)}")


def _vision_shape(v: Fields, values: dict[str, Any], text_hidden: int | None, *,
                  heads_key: str, out_key: str) -> None:
    hidden, heads, out = values["hidden"], values["heads"], values["out_hidden"]
    if hidden is not None and heads is not None and hidden % heads:
        v.fail(heads_key, f"expected a divisor of the vision hidden size ({hidden}), got {heads}")
    if out is not None and text_hidden is not None and out != text_hidden:
        v.fail(out_key, f"expected the language model's hidden_size ({text_hidden}), got {out}")


# .. Qwen3-VL ........................................................................


def _read_qwen3_vl(f: Fields) -> dict[str, Any]:
    """Qwen3-VL dense (Qwen3-VL-32B): a Qwen3 language model under text_config
    (Qwen3VLTextConfig: num_key_value_heads 32 and head_dim 128 are fixed defaults,
    required), a DeepStack vision tower under vision_config."""
    text = _sub_config(f, "text_config", ("qwen3_vl_text",))
    values = _read_qwen3(text) if text is not None else {}
    return _qwen3_vl(f, values, "qwen3_vl")


def _read_qwen3_vl_moe(f: Fields) -> dict[str, Any]:
    """Qwen3-VL MoE (Qwen3-VL-235B-A22B): a Qwen3-MoE language model under text_config
    (Qwen3VLMoeTextConfig: num_key_value_heads 16, a fixed default, required; head_dim
    derived), a DeepStack vision tower under vision_config."""
    text = _sub_config(f, "text_config", ("qwen3_vl_moe_text",))
    values = (_read_qwen_moe(text, kv_heads_class_default=16, shared_expert=False, qk_norm=True)
              if text is not None else {})
    return _qwen3_vl(f, values, "qwen3_vl_moe")


def _qwen3_vl(f: Fields, values: dict[str, Any], kind: str) -> dict[str, Any]:
    vision_fields = _sub_config(f, "vision_config", (kind, f"{kind}_vision"))
    vision = (_qwen_vision(vision_fields, values.get("hidden"), deepstack=True)
              if vision_fields is not None else None)
    # Qwen3VL(Moe)Config.tie_word_embeddings defaults to false
    return {**_wrapper_tie(f, values, False), "vision": vision}


# .. Kimi Linear, Kimi-K2.5 ...........................................................


def _read_kimi_linear(f: Fields) -> dict[str, Any]:
    """Kimi Linear (Kimi-Linear-48B-A3B; the checkpoint's configuration_kimi.py and
    modeling_kimi.py, no transformers class): Kimi Delta Attention layers (1-based
    linear_attn_config.kda_layers) and MLA layers (the others: full_attn_layers),
    the first first_k_dense_replace layers dense, then DeepSeek-style MoE with a
    sigmoid router and its score-correction bias (counted: the checkpoint stores it).

    MLA under mla_use_nope keeps the RoPE slice's weights and rotates nothing: no
    position encoding (Position.NONE), whose absence changes no weight.

    Kimi-K3's text model is this family with more (its modeling_kimi_linear.py; SGLang's
    models/kimi_k3.py): attention residuals (attn_res_block_size), routed experts in a
    latent space (routed_expert_hidden_size, latent_moe_use_norm), a gate on MLA's output
    (mla_use_output_gate), KDA's full-rank output gate (use_full_rank_gate) and the SiTU
    activation (hidden_act situ; its two betas are scalars). Its A_log stores head_dim
    values of which num_heads are used: counted as used."""
    _refuse_given(f, "moe_latent_size", "a latent mixture of experts under another name "
                                        "(Kimi's is routed_expert_hidden_size)")
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    kv_heads = f.int("num_key_value_heads", heads, min=1)  # None: num_attention_heads
    if heads is not None and kv_heads is not None and kv_heads != heads:
        f.fail("num_key_value_heads", f"multi-head latent attention has one key and value per "
                                      f"head: expected num_attention_heads ({heads}), got {kv_heads}")
    vocab = f.int("vocab_size", min=1)
    # KimiLinearConfig has no max_position_embeddings: its context is model_max_length;
    # Kimi-K3's config says max_position_embeddings instead
    if f.has("model_max_length") or not f.has("max_position_embeddings"):
        max_seq_len = f.int("model_max_length", min=1)
    else:
        max_seq_len = f.int("max_position_embeddings", min=1)
    if f.str("hidden_act", "silu") == "situ":
        activation: Activation | None = Activation.SITU
        for key in ("activation_situ_beta", "activation_situ_linear_beta"):
            f.float(key, 1.0, min=1e-6, max=1e6)
    else:
        activation = _activation(f, "hidden_act", "silu", gated=True)
    tied = f.bool("tie_word_embeddings", False)
    # MLA: q_lora_rank None (the class default) projects queries directly
    q_lora_rank = f.int("q_lora_rank", 0, min=1)
    mla = {key: f.int(key, min=1) for key in
           ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    nope = f.bool("mla_use_nope", False)
    raw = f.raw("linear_attn_config")
    kda: dict[str, Any] = dict.fromkeys(("linear_heads", "linear_key_dim", "conv_kernel"))
    mixers = None
    if raw is not None:
        la = f.child("linear_attn_config", raw)
        if la.ok:
            kda = {"linear_heads": la.int("num_heads", min=1),
                   "linear_key_dim": la.int("head_dim", min=1),
                   "conv_kernel": la.int("short_conv_kernel_size", min=1)}
            kda["kda_full_gate"] = la.bool("use_full_rank_gate", False)
            la.float("gate_lower_bound", -5.0, min=-1e6, max=1e6)
            mixers = _kimi_mixers(la, layers)
    values: dict[str, Any] = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=heads, vocab=vocab,
        activation=activation, position=Position.NONE if nope else Position.ROPE, tied_embeddings=tied,
        max_seq_len=max_seq_len, norm=Norm.RMSNORM, bias=False, q_lora_rank=q_lora_rank,
        **mla, mixers=mixers, **(kda if mixers is None or KDA in mixers else {}),
        mtp_layers=f.int("num_nextn_predict_layers", 0, min=0),
        attn_output_gate=f.bool("mla_use_output_gate", False),
        attn_res_block=f.int("attn_res_block_size", 0, min=0))
    ffn_hidden = f.int("intermediate_size", None, min=1)
    if f.has("num_experts"):  # None (the class default): a dense model
        experts = f.int("num_experts", min=1)
        top_k = f.int("num_experts_per_token", min=1)
        moe_ffn = f.int("moe_intermediate_size", min=1)
        shared = f.int("num_shared_experts", 0, min=0)
        first_dense = f.int("first_k_dense_replace", 0, min=0)
        freq = f.int("moe_layer_freq", 1, min=1)
        if freq is not None and freq != 1:
            f.fail("moe_layer_freq", f"expected 1, got {freq}: dense layers between the sparse "
                                     f"ones cannot be represented")
        if first_dense is not None and layers is not None and first_dense >= layers:
            f.fail("first_k_dense_replace", f"expected fewer than num_hidden_layers ({layers}), "
                                            f"got {first_dense}")
        func = f.str("moe_router_activation_func", "sigmoid")
        if func not in (None, "sigmoid", "softmax"):
            f.fail("moe_router_activation_func", f"expected sigmoid or softmax, got {shown(func)}")
        _check_routing(f, experts, top_k, experts_key="num_experts")
        groups = (f.int("num_expert_group", 1, min=1) if f.bool("use_grouped_topk", True) else 1)
        group_topk = f.int("topk_group", 1, min=1)
        route = (0, 0)
        if groups and group_topk and groups > 1 and experts and top_k:
            problem = route_group_problem(experts, top_k, groups, group_topk)
            if problem is None:
                route = (groups, group_topk)
            else:
                f.fail("num_expert_group" if problem[0] == "groups" else "topk_group", problem[1])
        values.update(
            ffn_hidden=_dense_width(f, ffn_hidden, first_dense, moe_ffn, "first_k_dense_replace"),
            experts=experts, top_k=top_k, moe_ffn_hidden=moe_ffn, shared_experts=shared,
            dense_layers=first_dense, route_groups=route[0], route_group_topk=route[1],
            router_bias=True, moe_latent=f.int("routed_expert_hidden_size", 0, min=0),
            moe_latent_norm=f.bool("latent_moe_use_norm", False))
        if values["moe_latent_norm"] and not values["moe_latent"]:
            f.fail("latent_moe_use_norm", "true normalizes a latent space: give "
                                          "routed_expert_hidden_size too")
    else:
        values["ffn_hidden"] = f.int("intermediate_size", min=1)
    _check_kinds(f, values, {"mixers": "linear_attn_config.kda_layers",
                             "linear_heads": "linear_attn_config.num_heads",
                             "linear_key_dim": "linear_attn_config.head_dim",
                             "conv_kernel": "linear_attn_config.short_conv_kernel_size",
                             "kv_lora_rank": "kv_lora_rank"})
    return values


def _kimi_mixers(la: Fields, layers: int | None) -> str | None:
    """Kimi Linear's layer kinds: layer i (0-based) is KDA where i + 1 is in kda_layers
    (KimiLinearConfig.is_kda_layer), MLA elsewhere; full_attn_layers must name exactly
    those others."""
    kda = la.int_list("kda_layers", min=1)
    full = la.int_list("full_attn_layers", (), min=1)
    if kda is None or full is None or layers is None:
        return None
    for key, indices in (("kda_layers", kda), ("full_attn_layers", full)):
        beyond = sorted(i for i in indices if i > layers)
        if beyond:
            la.fail(key, f"expected 1-based layer numbers up to num_hidden_layers ({layers}), got {beyond}")
            return None
    mixers = "".join(KDA if i + 1 in kda else FULL for i in range(layers))
    expected = [i + 1 for i in range(layers) if mixers[i] == FULL]
    if sorted(set(full)) != expected:
        la.fail("full_attn_layers", f"expected the layers kda_layers leaves out "
                                    f"{_indices(expected)}, got {_indices(sorted(set(full)))}")
        return None
    return mixers


def _read_kimi_k25(f: Fields) -> dict[str, Any]:
    """Kimi-K2.5: a DeepSeek-V3 language model (text_config, model_type kimi_k2) and the
    MoonViT vision tower with its patch-merger projector (vision_config; the checkpoint's
    modeling_kimi_k25.py)."""
    text = _sub_config(f, "text_config", ("kimi_k2", "deepseek_v3"))
    values = _deepseek_router_bias(text, _read_deepseek(text)) if text is not None else {}
    vision_fields = _sub_config(f, "vision_config", ("kimi_k25_vision", "moonvit"))
    vision = (_moonvit(vision_fields, values.get("hidden")) if vision_fields is not None else None)
    return {**_wrapper_tie(f, values, False), "vision": vision}


def _moonvit_shape(v: Fields) -> dict[str, Any]:
    """A MoonViT tower's sizes (Kimi-K2.5's and Kimi-K3's vision_config): blocks, widths,
    heads, patch, the projector's output width, the square merge kernel and the learned
    position table's rows."""
    height = v.int("init_pos_emb_height", min=1)
    width = v.int("init_pos_emb_width", min=1)
    merge = v.int_list("merge_kernel_size", min=1, max=VISION_LIMITS["merge"])
    if merge is not None and (len(merge) != 2 or merge[0] != merge[1]):
        v.fail("merge_kernel_size", f"expected a square kernel [k, k], got {list(merge)}")
        merge = None
    return {
        "layers": v.int("vt_num_hidden_layers", min=1, max=VISION_LIMITS["layers"]),
        "hidden": v.int("vt_hidden_size", min=1, max=VISION_LIMITS["hidden"]),
        "heads": v.int("vt_num_attention_heads", min=1, max=VISION_LIMITS["heads"]),
        "ffn_hidden": v.int("vt_intermediate_size", min=1, max=VISION_LIMITS["ffn_hidden"]),
        "patch_size": v.int("patch_size", min=1, max=VISION_LIMITS["patch_size"]),
        "out_hidden": v.int("text_hidden_size", min=1, max=VISION_LIMITS["out_hidden"]),
        "merge": merge[0] if merge else None,
        "positions": height * width if height and width else None,
    }


def _moonvit(v: Fields, text_hidden: int | None) -> Vision | None:
    """MoonViT (Kimi-K2.5's vision_tower): a Conv2d patch embedding with bias, a learned
    init_pos_emb_height x init_pos_emb_width position table, LayerNorm blocks with biased
    wqkv/wo and a plain GELU MLP, a final LayerNorm; the patch-merger projector
    (mm_projector: LayerNorm, merge^2 x hidden -> same -> text hidden, both biased)."""
    before = len(v.problems)
    # the checkpoint's configuration_kimi_k25.py is not transformers': its defaults are
    # not read here, every size is required
    values = _moonvit_shape(v)
    projector = v.str("mm_projector_type")
    if projector is not None and projector != "patchmerger":
        v.fail("mm_projector_type", f"expected patchmerger (Kimi-K2.5's), got {shown(projector)}")
    mm_hidden = v.int("mm_hidden_size", None, min=1)
    if mm_hidden is not None and values["hidden"] is not None and mm_hidden != values["hidden"]:
        v.fail("mm_hidden_size", f"expected vt_hidden_size ({values['hidden']}), got {mm_hidden}")
    # MoonViT variants Kimi-K3 introduced (RMSNorm, bias-free, gated MLP) differ in weights
    norm = v.str("norm_type", "layernorm")
    if norm is not None and norm != "layernorm":
        v.fail("norm_type", f"expected layernorm (MoonViT's), got {shown(norm)}")
    for key in ("attn_bias", "linear_bias", "patch_embed_proj_bias"):
        if v.bool(key, True) is False:
            v.fail(key, "false is not supported: MoonViT's linear layers carry biases")
    _vision_shape(v, values, text_hidden, heads_key="vt_num_attention_heads", out_key="text_hidden_size")
    if len(v.problems) > before:
        return None
    return Vision(**values, temporal_patch=1, channels=3, gated=False, norm=Norm.LAYERNORM,
                  bias=True, final_norm=True, projector="mlp")


def _deepseek_router_bias(f: Fields, values: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's noaux_tc router keeps an e_score_correction_bias of n_routed_experts
    per sparse layer, stored in the checkpoint: counted for the newer families (the
    deepseek_v3 reader leaves it out, as it always has)."""
    if f.str("topk_method", "noaux_tc") == "noaux_tc" and values.get("experts"):
        return {**values, "router_bias": True}
    return values


# .. DeepSeek-V3.2, GLM-5 (DeepSeek sparse attention) ..................................


def _read_deepseek_v32(f: Fields) -> dict[str, Any]:
    """DeepSeek-V3.2: DeepSeek-V3 with DeepSeek Sparse Attention on every layer (MTP
    included): a lightning indexer of index_n_heads heads of index_head_dim picking
    index_topk keys per query for MLA (DeepSeek-V3.2 inference code, ``Indexer``)."""
    return _with_indexer(f, _deepseek_router_bias(f, _read_deepseek(f)))


def _with_indexer(f: Fields, values: dict[str, Any]) -> dict[str, Any]:
    # the class defaults (64 or 32 heads of 128, top 2048) are the flagships': required
    values = {**values, "index_heads": f.int("index_n_heads", min=1),
              "index_head_dim": f.int("index_head_dim", min=1),
              "index_topk": f.int("index_topk", min=1)}
    if values["layers"] is not None:
        values["mixers"] = SPARSE * values["layers"]
    _check_kinds(f, values, {"index_heads": "index_n_heads", "mixers": "model_type",
                             "kv_lora_rank": "kv_lora_rank"})
    return values


def _read_glm_moe_dsa(f: Fields) -> dict[str, Any]:
    """GLM-5 (transformers configuration_glm_moe_dsa.py): DeepSeek-V3.2's layout (MLA,
    the DSA indexer on every layer, first_k_dense_replace dense layers, then MoE with a
    shared expert, MTP) under GLM's sizes. qk_head_dim is qk_nope + qk_rope; head_dim is
    overwritten with qk_rope_head_dim by the class (not a shape)."""
    values = _read_deepseek(f)
    f.int("head_dim", None, min=1)
    qk = f.int("qk_head_dim", None, min=1)
    nope, rope = values["qk_nope_head_dim"], values["qk_rope_head_dim"]
    if qk is not None and nope is not None and rope is not None and qk != nope + rope:
        f.fail("qk_head_dim", f"expected qk_nope_head_dim + qk_rope_head_dim ({nope + rope}), got {qk}")
    # layers that reuse an earlier layer's top-k ("shared") have no indexer of their own
    shared = ("layers sharing another layer's top-k selection are not supported (every layer "
              "is read as running its own indexer)")
    types = f.raw("indexer_types", None)
    if types is not None and (not isinstance(types, list) or set(types) - {"full"}):
        f.fail("indexer_types", shared)
    pattern = f.raw("index_topk_pattern", None)
    if pattern is not None and (not isinstance(pattern, (str, list)) or set(pattern) - {"F", "full"}):
        f.fail("index_topk_pattern", shared)
    freq = f.int("index_topk_freq", 1, min=1)
    if freq is not None and freq != 1:
        f.fail("index_topk_freq", shared)
    dense = values["dense_layers"]
    kinds = f.raw("mlp_layer_types", None)
    if kinds is not None and dense is not None and values["layers"] is not None:
        expected = ["dense"] * dense + ["sparse"] * (values["layers"] - dense)
        if kinds != expected:
            f.fail("mlp_layer_types", f"expected first_k_dense_replace ({dense}) dense layers, "
                                      f"then sparse ones: other orders cannot be represented")
    return _with_indexer(f, _deepseek_router_bias(f, values))


# .. Nemotron-H ........................................................................


def _read_nemotron_h(f: Fields) -> dict[str, Any]:
    """Nemotron-H and Nemotron 3 (transformers configuration_nemotron_h.py,
    modular_nemotron_h.py): blocks of one pre-norm and one mixer each, as
    hybrid_override_pattern (M Mamba-2, * attention, - a ReLU^2 MLP, E MoE) or
    layers_block_type says; each block is one Model layer whose other half is empty.
    Attention has no position encoding (NemotronHAttention is JambaAttention: no
    rotary: Position.NONE). MoE: DeepSeek-V3's router with its
    score-correction bias, non-gated routed experts of moe_intermediate_size and one
    shared expert of moe_shared_expert_intermediate_size; Nemotron 3 Ultra's routed experts
    run in a latent space of moe_latent_size (Megatron-Core's moe_latent_size:
    fc1_latent_proj and fc2_latent_proj around them, no norm between)."""
    pattern = _nemotron_pattern(f)
    layers = len(pattern) if pattern is not None else None
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    kv_heads = f.int("num_key_value_heads", min=1)  # class default 8: required
    # head_dim (class default 128, required); the 56B's remote config calls it
    # attention_head_dim
    old = f.has("attention_head_dim") and not f.has("head_dim")
    head_dim = f.int("attention_head_dim" if old else "head_dim", min=1)
    if not old and f.has("attention_head_dim") and f.int("attention_head_dim", min=1) != head_dim:
        f.fail("attention_head_dim", f"expected head_dim ({head_dim})")
    _check_heads(f, hidden, heads, kv_heads, head_dim,
                 keys=("hidden_size", "num_attention_heads", "num_key_value_heads"), has_head_dim=True)
    for key, what in (("attention_bias", "biased attention projections"),
                      ("mlp_bias", "biased MLPs"), ("use_bias", "biased Mamba projections")):
        _refuse_true(f, key, what)
    if f.bool("use_conv_bias", True) is False:
        f.fail("use_conv_bias", "false is not supported: Model's Mamba-2 convolution has a bias")
    activation = _activation(f, "mlp_hidden_act", "relu2", gated=False)
    symbols = set(pattern or "")
    values: dict[str, Any] = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=_explicit_head_dim(hidden, heads, head_dim),
        vocab=f.int("vocab_size", min=1), activation=activation,
        position=Position.NONE,  # NemotronHAttention applies no rotary embedding (NoPE)
        tied_embeddings=f.bool("tie_word_embeddings", False),
        max_seq_len=f.int("max_position_embeddings", min=1), norm=Norm.RMSNORM, bias=False,
        mixers="".join(_NEMOTRON_BLOCKS[c][0] for c in pattern) if pattern else None,
        mlps="".join(_NEMOTRON_BLOCKS[c][1] for c in pattern) if pattern else None,
        # NemotronHForCausalLM builds no MTP module (it ignores mtp.* weights)
        mtp_layers=f.int("num_nextn_predict_layers", 0, min=0))
    if "M" in symbols or pattern is None:
        # NemotronHMamba2Mixer: inner width mamba_num_heads x mamba_head_dim (expand unused)
        values.update(mamba_heads=f.int("mamba_num_heads", min=1),
                      mamba_head_dim=f.int("mamba_head_dim", min=1),
                      ssm_state=f.int("ssm_state_size", min=1), ssm_groups=f.int("n_groups", min=1),
                      conv_kernel=f.int("conv_kernel", min=1))
    # intermediate_size (class default 21504, the flagship's) is required where an MLP
    # block uses it
    ffn = (f.int("intermediate_size", min=1) if "-" in symbols
           else f.int("intermediate_size", None, min=1))
    if "E" in symbols:
        experts = f.int("n_routed_experts", min=1)
        top_k = f.int("num_experts_per_tok", min=1)
        moe_ffn = f.int("moe_intermediate_size", min=1)
        shared_ffn = f.int("moe_shared_expert_intermediate_size", min=0)
        _check_routing(f, experts, top_k, experts_key="n_routed_experts")
        groups, group_topk = _route_groups(f, experts, top_k)
        values.update(experts=experts, top_k=top_k, moe_ffn_hidden=moe_ffn,
                      shared_experts=1 if shared_ffn else 0, shared_ffn_hidden=shared_ffn,
                      route_groups=groups, route_group_topk=group_topk, router_bias=True,
                      ffn_hidden=ffn if ffn is not None else moe_ffn,
                      moe_latent=f.int("moe_latent_size", 0, min=0))
    else:
        _refuse_given(f, "moe_latent_size", "a latent space for experts no block has")
        # no MLP block uses it (only Mamba and attention blocks): Model wants a width
        values["ffn_hidden"] = ffn if ffn is not None or f.has("intermediate_size") else hidden
    _check_kinds(f, values, {"mixers": _nemotron_key(f), "mlps": _nemotron_key(f),
                             "mamba_heads": "mamba_num_heads", "ssm_state": "ssm_state_size",
                             "ssm_groups": "n_groups", "experts": "n_routed_experts"})
    return values


def _nemotron_key(f: Fields) -> str:
    return "layers_block_type" if f.has("layers_block_type") else "hybrid_override_pattern"


def _nemotron_pattern(f: Fields) -> str | None:
    """The blocks as hybrid_override_pattern symbols, from layers_block_type (which wins
    in NemotronHConfig) or hybrid_override_pattern; num_hidden_layers, where given, must
    count them (the class warns and uses the pattern's length)."""
    if f.has("layers_block_type"):
        pattern = _layer_pattern(f, "layers_block_type", None, _NEMOTRON_BLOCK_TYPES)
        key = "layers_block_type"
        if pattern is not None and f.has("hybrid_override_pattern"):
            other = f.str("hybrid_override_pattern")
            if other is not None and other != pattern:
                f.fail("hybrid_override_pattern", "disagrees with layers_block_type (give one)")
    else:
        key = "hybrid_override_pattern"
        pattern = f.str(key)
        if pattern is not None:
            bad = sorted(set(pattern) - set(_NEMOTRON_BLOCKS))
            if bad:
                f.fail(key, f"unknown block symbol {bad[0]!r}; expected one per layer of "
                            f"M (Mamba-2), * (attention), - (MLP), E (mixture of experts)")
                return None
    if pattern is None:
        return None
    layers = f.int("num_hidden_layers", None, min=1)
    if layers is not None and layers != len(pattern):
        f.fail(key, f"expected one block per layer (num_hidden_layers {layers}), got {len(pattern)}")
        return None
    if not set(pattern) & {"M", "*"}:
        f.fail(key, "no block mixes tokens: expected at least one M or *")
        return None
    return pattern


# .. gpt-oss ...........................................................................


def _read_gpt_oss(f: Fields) -> dict[str, Any]:
    """gpt-oss (transformers configuration_gpt_oss.py, modeling_gpt_oss.py): GQA with
    biases on q, k, v and o and one learned sink logit per head, sliding-window layers
    (layer_types; derived: even layers sliding) of sliding_window tokens, every MLP a
    mixture of num_local_experts biased SwiGLU experts (clamped at swiglu_limit: an
    elementwise change) behind a biased router."""
    # every size's class default is gpt-oss-120b's: all required
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    kv_heads = f.int("num_key_value_heads", min=1)
    head_dim = f.int("head_dim", min=1)
    _check_heads(f, hidden, heads, kv_heads, head_dim,
                 keys=("hidden_size", "num_attention_heads", "num_key_value_heads"), has_head_dim=True)
    experts = f.int("num_local_experts", min=1)
    top_k = f.int("num_experts_per_tok", min=1)
    legacy = f.int("experts_per_token", None, min=1)  # the original release's spelling
    if legacy is not None and top_k is not None and legacy != top_k:
        f.fail("experts_per_token", f"expected num_experts_per_tok ({top_k}), got {legacy}")
    _check_routing(f, experts, top_k, experts_key="num_local_experts")
    ffn = f.int("intermediate_size", min=1)
    if f.has("layer_types"):
        mixers = _layer_pattern(f, "layer_types", layers, _SLIDING_LAYER_TYPES)
    else:  # GptOssConfig: sliding where (i + 1) % 2, full otherwise
        mixers = None if layers is None else "".join(SLIDING if (i + 1) % 2 else FULL
                                                     for i in range(layers))
    window = f.int("sliding_window", min=1) if mixers is None or SLIDING in mixers else 0
    values = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=_explicit_head_dim(hidden, heads, head_dim), ffn_hidden=ffn,
        vocab=f.int("vocab_size", min=1), activation=_activation(f, "hidden_act", "silu", gated=True),
        position=Position.ROPE, tied_embeddings=f.bool("tie_word_embeddings", False),
        max_seq_len=f.int("max_position_embeddings", min=1), norm=Norm.RMSNORM,
        bias=f.bool("attention_bias", True),
        dropout=bool(f.float("attention_dropout", 0.0, min=0.0, max=1.0)),
        experts=experts, top_k=top_k, moe_ffn_hidden=ffn, expert_bias=True, router_bias=True,
        attention_sinks=True, mixers=_sliding_mixers(mixers),
        sliding_window=window)
    _check_kinds(f, values, {"mixers": "layer_types"})
    return values


# .. Gemma 4 ............................................................................


def _read_gemma4(f: Fields) -> dict[str, Any]:
    """Gemma 4 (transformers configuration_gemma4.py, modular_gemma4.py): a text model
    under text_config, a vision tower under vision_config (an audio tower, where
    audio_config is given, is not modelled)."""
    if f.raw("audio_config", None) is not None:
        f.fail("audio_config", "an audio tower is not modelled (expected null)")
    text = _sub_config(f, "text_config", ("gemma4_text",))
    values = _gemma4_text(text) if text is not None else {}
    vision_fields = _sub_config(f, "vision_config", ("gemma4_vision",))
    vision = (_gemma4_vision(vision_fields, values.get("hidden"))
              if vision_fields is not None else None)
    # Gemma4Config.tie_word_embeddings defaults to true
    return {**_wrapper_tie(f, values, True), "vision": vision}


def _gemma4_text(f: Fields) -> dict[str, Any]:
    """Sliding-window layers (head_dim, num_key_value_heads) and full-attention layers
    (global_head_dim; with attention_k_eq_v, num_global_key_value_heads and no v_proj:
    the keys are the values), q/k RMSNorms, a norm before and after attention and MLP;
    with enable_moe_block every layer runs its dense GeGLU MLP and a mixture of
    num_experts experts side by side: Model's shared expert (of intermediate_size) and
    routed experts.

    Not counted (no Model field; 0.001 % of Gemma-4-26B-A4B): per layer the MoE block's
    three extra norms (pre_feedforward_layernorm_2, post_feedforward_layernorm_1 and _2:
    3 x hidden_size), the router's scale (hidden_size) and per_expert_scale
    (num_experts), and the layer_scalar (1): 4 x 2816 + 128 + 1 = 11,393 per layer of
    the 26B-A4B, 341,790 in all; the dense 31B misses its 60 layer_scalars only."""
    # every size's class default is a flagship's: required
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    kv_heads = f.int("num_key_value_heads", min=1)
    head_dim = f.int("head_dim", min=1)
    _check_heads(f, hidden, heads, kv_heads, head_dim,
                 keys=("hidden_size", "num_attention_heads", "num_key_value_heads"), has_head_dim=True)
    _refuse_true(f, "attention_bias", "biased attention projections")
    _refuse_true(f, "use_double_wide_mlp", "double-width MLPs")
    # per-layer input embeddings (Gemma 3n-style PLE; class default 256): required, 0
    ple = f.int("hidden_size_per_layer_input", min=0)
    if ple:
        f.fail("hidden_size_per_layer_input", f"{ple} is not supported: per-layer input "
                                              f"embeddings are not modelled (expected 0)")
    shared_kv = f.int("num_kv_shared_layers", 0, min=0)
    if shared_kv:
        f.fail("num_kv_shared_layers", f"{shared_kv} is not supported: layers reusing another "
                                       f"layer's keys and values are not modelled (expected 0)")
    bidirectional = f.str("use_bidirectional_attention", None)
    if bidirectional not in (None, "vision"):
        f.fail("use_bidirectional_attention", f"expected vision or null (a causal text model), "
                                              f"got {shown(bidirectional)}")
    if f.has("layer_types"):
        mixers = _layer_pattern(f, "layer_types", layers, _SLIDING_LAYER_TYPES)
    else:  # Gemma4TextConfig: every sixth layer full ("5:1")
        mixers = None if layers is None else "".join(SLIDING if (i + 1) % 6 else FULL
                                                     for i in range(layers))
    if mixers:  # Gemma4TextConfig forces the last layer to full attention
        mixers = mixers[:-1] + FULL
    k_eq_v = f.bool("attention_k_eq_v", False)
    global_dim = f.int("global_head_dim", min=1)  # the class pops it with 512: required
    global_kv = f.int("num_global_key_value_heads", None, min=1)
    # the class applies num_global_key_value_heads only with attention_k_eq_v
    global_kv = global_kv if k_eq_v else None
    if global_kv is not None and heads is not None and heads % global_kv:
        f.fail("num_global_key_value_heads", f"expected a divisor of num_attention_heads ({heads})")
    window = f.int("sliding_window", min=1) if mixers is None or SLIDING in mixers else 0
    ffn = f.int("intermediate_size", min=1)
    values: dict[str, Any] = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=_explicit_head_dim(hidden, heads, head_dim), ffn_hidden=ffn,
        vocab=f.int("vocab_size", min=1),
        activation=_activation(f, "hidden_activation", "gelu_pytorch_tanh", gated=True),
        position=Position.ROPE, tied_embeddings=True,
        max_seq_len=f.int("max_position_embeddings", min=1), norm=Norm.RMSNORM, bias=False,
        dropout=bool(f.float("attention_dropout", 0.0, min=0.0, max=1.0)),
        qk_norm=True, sandwich_norms=True, sliding_window=window,
        mixers=_sliding_mixers(mixers),
        global_head_dim=global_dim if global_dim != head_dim else 0,
        global_kv_heads=global_kv if global_kv not in (None, kv_heads) else 0,
        global_k_eq_v=bool(k_eq_v))
    if mixers is not None and SLIDING not in mixers:  # every layer full: its sizes are the model's
        values.update(head_dim=_explicit_head_dim(hidden, heads, global_dim), global_head_dim=0,
                      kv_heads=global_kv or kv_heads, global_kv_heads=0)
        if k_eq_v:
            f.fail("attention_k_eq_v", "true with no sliding layer is not supported")
    if f.bool("enable_moe_block", False):
        experts = f.int("num_experts", min=1)
        top_k = f.int("top_k_experts", min=1)
        _check_routing(f, experts, top_k, experts_key="num_experts")
        values.update(experts=experts, top_k=top_k,
                      moe_ffn_hidden=f.int("moe_intermediate_size", min=1),
                      shared_experts=1, shared_ffn_hidden=ffn)
    _check_kinds(f, values, {"mixers": "layer_types", "global_head_dim": "global_head_dim",
                             "global_kv_heads": "num_global_key_value_heads",
                             "experts": "num_experts"})
    return values


def _gemma4_vision(v: Fields, text_hidden: int | None) -> Vision | None:
    """Gemma 4's vision tower: a bias-free patch projection, a learned two-axis position
    table (2 x position_embedding_size rows), blocks like the text model's (q/k RMSNorm,
    four RMSNorms, gated GELU MLP, no biases), pooling_kernel_size^2 patches pooled into
    one token and one bias-free projection to the text width. Not counted: the
    standardize step's std_bias and std_scale (2 x hidden_size; 2,304 for the 26B)."""
    before = len(v.problems)
    # every size's class default is a flagship's: required
    values = {
        "layers": v.int("num_hidden_layers", min=1, max=VISION_LIMITS["layers"]),
        "hidden": v.int("hidden_size", min=1, max=VISION_LIMITS["hidden"]),
        "heads": v.int("num_attention_heads", min=1, max=VISION_LIMITS["heads"]),
        "ffn_hidden": v.int("intermediate_size", min=1, max=VISION_LIMITS["ffn_hidden"]),
        "patch_size": v.int("patch_size", min=1, max=VISION_LIMITS["patch_size"]),
        "merge": v.int("pooling_kernel_size", min=1, max=VISION_LIMITS["merge"]),
        "out_hidden": text_hidden,
    }
    table = v.int("position_embedding_size", min=1, max=VISION_LIMITS["positions"] // 2)
    values["positions"] = 2 * table if table is not None else None
    kv = v.int("num_key_value_heads", min=1)
    if kv is not None and values["heads"] is not None and kv != values["heads"]:
        v.fail("num_key_value_heads", f"expected num_attention_heads ({values['heads']}): "
                                      f"grouped-query vision attention is not modelled")
    head_dim = v.int("head_dim", min=1)
    if (head_dim is not None and values["hidden"] and values["heads"]
            and head_dim * values["heads"] != values["hidden"]):
        v.fail("head_dim", f"expected hidden_size / num_attention_heads "
                           f"({values['hidden'] // values['heads']}), got {head_dim}")
    _refuse_true(v, "attention_bias", "biased vision attention")
    _refuse_true(v, "use_clipped_linears", "clipped linear layers (their bounds are weights)")
    v.bool("standardize", False)
    act = v.str("hidden_activation", "gelu_pytorch_tanh")
    if act is not None and act not in _GELU_NAMES:
        v.fail("hidden_activation", f"expected a GELU, got {shown(act)}")
    _vision_shape(v, values, None, heads_key="num_attention_heads", out_key="hidden_size")
    if len(v.problems) > before or text_hidden is None:
        return None
    return Vision(**values, temporal_patch=1, channels=3, gated=True, norm=Norm.RMSNORM,
                  bias=False, qk_norm=True, sandwich_norms=True, projector="linear")


# .. Gemma 3 ............................................................................

# Gemma3TextConfig's defaults (transformers configuration_gemma3.py) that Google's published
# Gemma 3 configs leave out, transformers filling them in: google/gemma-3-4b-it's gives
# neither heads, KV heads nor head_dim, no Gemma 3 config gives vocab_size, and the
# checkpoints were built to these values. They are read with these defaults; the class's
# other sizes (hidden_size 2304, intermediate_size 9216, 26 layers, sliding_window 4096:
# Gemma 2's) are no Gemma 3's and every published config gives them: required.
_GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
                         "head_dim": 256, "max_position_embeddings": 131_072}
# Gemma3TextConfig: without layer_types, every sliding_window_pattern-th layer is full
_GEMMA3_PATTERN = 6


def _read_gemma3_text(f: Fields) -> dict[str, Any]:
    """Gemma 3's language model (transformers configuration_gemma3.py Gemma3TextConfig,
    modeling_gemma3.py Gemma3DecoderLayer; ``gemma3_text``, Gemma 3 1B's config): GQA with
    q/k RMSNorms of head_dim, a norm before and after attention and MLP, a gated GELU
    (GeGLU) MLP, no biases, tied embeddings; sliding-window layers of sliding_window tokens
    and full-attention layers as layer_types says or, without it, every
    sliding_window_pattern-th layer full (default 6: five local layers, then one global;
    unlike Gemma 4 the last layer is not forced global). Read for their types and left to
    the kernels (scalars, no weights): query_pre_attn_scalar, rope_theta,
    rope_local_base_freq, rope_scaling, attn_logit_softcapping, final_logit_softcapping."""
    d = _GEMMA3_TEXT_DEFAULTS
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", d["num_attention_heads"], min=1)
    kv_heads = f.int("num_key_value_heads", d["num_key_value_heads"], min=1)
    head_dim = f.int("head_dim", d["head_dim"], min=1)
    _check_heads(f, hidden, heads, kv_heads, head_dim,
                 keys=("hidden_size", "num_attention_heads", "num_key_value_heads"), has_head_dim=True)
    _refuse_true(f, "attention_bias", "biases on q, k, v and o only (Model biases every linear "
                                      "layer or only q, k, v)")
    _refuse_true(f, "use_bidirectional_attention", "bidirectional attention (EmbeddingGemma's "
                                                   "encoder) is not a causal language model")
    if f.has("layer_types"):  # it wins over sliding_window_pattern (Gemma3TextConfig)
        f.int("sliding_window_pattern", None, min=1)
        mixers = _layer_pattern(f, "layer_types", layers, _SLIDING_LAYER_TYPES)
    else:
        every = f.int("sliding_window_pattern", _GEMMA3_PATTERN, min=1)
        mixers = (None if layers is None or every is None else
                  "".join(SLIDING if (i + 1) % every else FULL for i in range(layers)))
    window = f.int("sliding_window", min=1) if mixers is None or SLIDING in mixers else 0
    for key in ("query_pre_attn_scalar", "rope_theta", "rope_local_base_freq",
                "attn_logit_softcapping", "final_logit_softcapping"):
        f.float(key, None, positive=True)
    _rope_scaling(f)
    values: dict[str, Any] = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=_explicit_head_dim(hidden, heads, head_dim),
        ffn_hidden=f.int("intermediate_size", min=1),
        vocab=f.int("vocab_size", d["vocab_size"], min=1),
        activation=_activation(f, "hidden_activation", "gelu_pytorch_tanh", gated=True),
        position=Position.ROPE, tied_embeddings=f.bool("tie_word_embeddings", True),
        max_seq_len=f.int("max_position_embeddings", d["max_position_embeddings"], min=1),
        norm=Norm.RMSNORM, bias=False,
        dropout=bool(f.float("attention_dropout", 0.0, min=0.0, max=1.0)),
        qk_norm=True, sandwich_norms=True, sliding_window=window,
        mixers=_sliding_mixers(mixers))
    _check_kinds(f, values, {"mixers": "layer_types"})
    return values


def _rope_scaling(f: Fields) -> None:
    """``rope_scaling``: null or a mapping naming its rope_type (or the older ``type``) and
    a positive factor; it rescales positions, no weights."""
    raw = f.raw("rope_scaling", None)
    if raw is None:
        return
    scaling = f.child("rope_scaling", raw)
    if scaling.ok:
        scaling.str("rope_type" if scaling.has("rope_type") else "type", None)
        scaling.float("factor", None, positive=True)


def _read_gemma3(f: Fields) -> dict[str, Any]:
    """Gemma 3 multimodal (transformers Gemma3Config, Gemma3ForConditionalGeneration; Gemma 3
    4B, 12B and 27B): the language model under text_config (gemma3_text), SigLIP under
    vision_config (siglip_vision_model) and Gemma 3's projector sized by
    mm_tokens_per_image."""
    text = _sub_config(f, "text_config", ("gemma3_text",))
    values = _read_gemma3_text(text) if text is not None else {}
    vision_fields = _sub_config(f, "vision_config", ("siglip_vision_model",))
    vision = (_siglip_vision(vision_fields, f, values.get("hidden"))
              if vision_fields is not None else None)
    # Gemma3Config.tie_word_embeddings defaults to true (PretrainedConfig's before it)
    return {**_wrapper_tie(f, values, True), "vision": vision}


def _siglip_vision(v: Fields, top: Fields, text_hidden: int | None) -> Vision | None:
    """SigLIP as Gemma 3 builds it (transformers modeling_siglip.py SiglipVisionTransformer)
    and Gemma 3's projector (modeling_gemma3.py Gemma3MultiModalProjector): a Conv2d patch
    embedding with bias, a learned position per patch of the (image_size / patch_size)^2
    grid, LayerNorm blocks with biased q, k, v and out_proj and a plain GELU MLP (fc1, fc2),
    the post_layernorm, no attention-pooling head; then the patch grid average-pooled to
    ``mm_tokens_per_image`` tokens (the pool's kernel is Vision.merge: 64 x 64 patches of
    Gemma 3's 896-pixel image in 4 x 4 squares, 256 tokens), each RMS-normalized over the
    vision width (mm_soft_emb_norm) and projected to the text width by one bias-free matrix
    (mm_input_projection_weight)."""
    before = len(v.problems)
    # SiglipVisionConfig's size defaults are siglip-base-patch16-224's: required
    values: dict[str, Any] = {
        "layers": v.int("num_hidden_layers", min=1, max=VISION_LIMITS["layers"]),
        "hidden": v.int("hidden_size", min=1, max=VISION_LIMITS["hidden"]),
        "heads": v.int("num_attention_heads", min=1, max=VISION_LIMITS["heads"]),
        "ffn_hidden": v.int("intermediate_size", min=1, max=VISION_LIMITS["ffn_hidden"]),
        "patch_size": v.int("patch_size", min=1, max=VISION_LIMITS["patch_size"]),
        "channels": v.int("num_channels", 3, min=1, max=VISION_LIMITS["channels"]),
        "out_hidden": text_hidden,
    }
    image = v.int("image_size", min=1)
    _plain_gelu(v, "hidden_act", "gelu_pytorch_tanh")
    # modeling_siglip.py builds the head unless vision_use_head says false
    if not v.has("vision_use_head"):
        v.fail("vision_use_head", "missing: SigLIP builds its attention-pooling head unless it is "
                                  "false, and that head is not modelled (Gemma 3's configs say false)")
    else:
        _refuse_true(v, "vision_use_head", "SigLIP's attention-pooling head is not modelled "
                                           "(Gemma 3 reads the patches, not the pooled output)")
    _vision_shape(v, values, None, heads_key="num_attention_heads", out_key="hidden_size")
    patch = values["patch_size"]
    side = image // patch if image is not None and patch is not None else None
    if side is not None and not 1 <= side * side <= VISION_LIMITS["positions"]:
        v.fail("image_size", f"expected 1 to {VISION_LIMITS['positions']} patches of patch_size "
                             f"({patch}), got ({image} // {patch})^2 = {side * side}")
        side = None
    values["positions"] = side * side if side else None
    values["merge"] = _gemma3_pool(top, side)
    if len(v.problems) > before or text_hidden is None or values["merge"] is None:
        return None
    return Vision(**values, temporal_patch=1, gated=False, norm=Norm.LAYERNORM, bias=True,
                  qk_norm=False, sandwich_norms=False, final_norm=True, projector="linear",
                  projector_norm=True)


def _gemma3_pool(f: Fields, side: int | None) -> int | None:
    """The average pool's kernel (Gemma3MultiModalProjector: patches per side // the square
    root of mm_tokens_per_image, default 256), where it makes exactly mm_tokens_per_image
    tokens of the ``side`` x ``side`` patch grid."""
    tokens = f.int("mm_tokens_per_image", 256, min=1)
    if tokens is None or side is None:
        return None
    per_side = math.isqrt(tokens)
    kernel = side // per_side
    if per_side * per_side != tokens or not kernel or kernel * per_side != side:
        f.fail("mm_tokens_per_image", f"expected a square whose side divides the {side} patches "
                                      f"per side (image_size // patch_size), got {tokens}")
        return None
    if kernel > VISION_LIMITS["merge"]:
        f.fail("mm_tokens_per_image", f"expected at most {VISION_LIMITS['merge']} x "
                                      f"{VISION_LIMITS['merge']} patches pooled per token, got "
                                      f"{kernel} x {kernel}")
        return None
    return kernel


# .. MiniMax-M2 ..........................................................................


def _read_minimax_m2(f: Fields) -> dict[str, Any]:
    """MiniMax-M2 / M2.5 (transformers configuration_minimax_m2.py; the checkpoint's
    configuration_minimax_m2.py for the switches): GQA with RMSNorms on queries and keys,
    every MLP a mixture of num_local_experts SwiGLU experts of intermediate_size behind
    a sigmoid router with a score-correction bias (use_routing_bias).

    Not counted: qk_norm_type per_layer normalizes each token's queries (and keys)
    across all heads at once, (heads + kv_heads) x head_dim weights a layer where Model
    counts 2 x head_dim: 6,912 a layer of MiniMax-M2.5, 428,544 in all (0.0002 %).
    Not built: the num_mtp_modules MTP modules use_mtp names (transformers builds none,
    and the released checkpoint holds no mtp weights)."""
    # every size's class default is MiniMax-M2's: all required
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    kv_heads = f.int("num_key_value_heads", min=1)
    head_dim = f.int("head_dim", min=1)
    _check_heads(f, hidden, heads, kv_heads, head_dim,
                 keys=("hidden_size", "num_attention_heads", "num_key_value_heads"), has_head_dim=True)
    experts = f.int("num_local_experts", min=1)
    top_k = f.int("num_experts_per_tok", min=1)
    _check_routing(f, experts, top_k, experts_key="num_local_experts")
    ffn = f.int("intermediate_size", min=1)
    kinds = f.raw("attn_type_list", None)
    if kinds is not None and (not isinstance(kinds, list) or any(k != 1 for k in kinds)):
        f.fail("attn_type_list", "expected softmax attention (1) on every layer: MiniMax's "
                                 "lightning (linear) attention layers (0) are not modelled")
    shared = f.int("shared_intermediate_size", 0, min=0)
    if shared:
        f.fail("shared_intermediate_size", f"{shared} is not supported: MiniMax-M2 has no shared expert")
    qk_norm = f.bool("use_qk_norm", True)
    norm_type = f.str("qk_norm_type", "per_layer")
    if norm_type not in (None, "per_layer", "per_head"):
        f.fail("qk_norm_type", f"expected per_layer or per_head, got {shown(norm_type)}")
    _refuse_true(f, "attention_bias", "biased attention projections")
    f.bool("use_mtp", False)
    values = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=_explicit_head_dim(hidden, heads, head_dim), ffn_hidden=ffn,
        vocab=f.int("vocab_size", min=1), activation=_activation(f, "hidden_act", "silu", gated=True),
        position=Position.ROPE, tied_embeddings=f.bool("tie_word_embeddings", False),
        max_seq_len=f.int("max_position_embeddings", min=1), norm=Norm.RMSNORM, bias=False,
        dropout=bool(f.float("attention_dropout", 0.0, min=0.0, max=1.0)),
        qk_norm=bool(qk_norm), experts=experts, top_k=top_k, moe_ffn_hidden=ffn,
        router_bias=f.bool("use_routing_bias", True))
    return values


# .. families refused by name ...........................................................


def _read_deepseek_v4(f: Fields) -> dict[str, Any]:
    """DeepSeek-V4 (its inference code, model.py; DeepSeek-V4 report): every layer's
    attention has queries through q_lora_rank, one key-value head of head_dim, a sink per
    head and the grouped low-rank output (o_groups x o_lora_rank); compress_ratios says per
    layer what it attends to beyond its sliding_window of raw keys: nothing (0), the
    index_topk of the keys pooled from every 4 tokens its indexer picks (4, compressed
    sparse attention: the only ratio with an indexer and overlapping windows in that code),
    or every key pooled from a larger ratio (heavily compressed attention). Each block's
    residual is hc_mult streams mixed by Sinkhorn-normalized hyper-connections. Every layer
    is DeepSeekMoE; the first num_hash_layers route by a token-id table (tid2eid, not a
    trained weight: same shapes, nothing counted); num_nextn_predict_layers MTP modules
    follow, their compress_ratios entries after the layers' (sliding window only, as the
    code assumes). qk_rope_head_dim is the RoPE'd share of head_dim (no weights of its
    own); swiglu_limit clamps the activation (no weights)."""
    layers = f.int("num_hidden_layers", min=1)
    hidden = f.int("hidden_size", min=1)
    heads = f.int("num_attention_heads", min=1)
    if f.int("num_key_value_heads", 1, min=1) not in (1, None):
        f.fail("num_key_value_heads", "DeepSeek-V4's attention has one key-value head: expected 1")
    head_dim = f.int("head_dim", min=1)
    rope = f.int("qk_rope_head_dim", min=0)
    if rope is not None and head_dim is not None and rope > head_dim:
        f.fail("qk_rope_head_dim", f"expected at most head_dim ({head_dim}), got {rope}")
    _refuse_true(f, "attention_bias", "biased attention projections are not modelled")
    _refuse_given(f, "first_k_dense_replace", "dense layers before DeepSeek-V4's MoE layers")
    experts = f.int("n_routed_experts", min=1)
    top_k = f.int("num_experts_per_tok", min=1)
    _check_routing(f, experts, top_k, experts_key="n_routed_experts")
    hash_layers = f.int("num_hash_layers", 0, min=0)
    if hash_layers is not None and layers is not None and hash_layers > layers:
        f.fail("num_hash_layers", f"expected at most num_hidden_layers ({layers}), got {hash_layers}")
    moe_ffn = f.int("moe_intermediate_size", min=1)
    mtp = f.int("num_nextn_predict_layers", 0, min=0)
    hc = f.int("hc_mult", min=1)
    iters = f.int("hc_sinkhorn_iters", 1, min=1)
    f.float("hc_eps", 1e-6, min=0.0, max=1.0)
    f.float("swiglu_limit", 0.0, min=0.0, max=1e6)
    mixers, csa, hca = _v4_mixers(f, layers, mtp)
    values = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=1, head_dim=head_dim,
        ffn_hidden=moe_ffn, vocab=f.int("vocab_size", min=1),
        activation=_activation(f, "hidden_act", "silu", gated=True), position=Position.ROPE,
        tied_embeddings=f.bool("tie_word_embeddings", False),
        max_seq_len=f.int("max_position_embeddings", min=1), norm=Norm.RMSNORM,
        dropout=bool(f.float("attention_dropout", 0.0, min=0.0, max=1.0)),
        experts=experts, top_k=top_k, moe_ffn_hidden=moe_ffn,
        shared_experts=f.int("n_shared_experts", 0, min=0), mtp_layers=mtp,
        q_lora_rank=f.int("q_lora_rank", min=1), qk_rope_head_dim=rope, o_groups=f.int("o_groups", min=1),
        o_lora_rank=f.int("o_lora_rank", min=1), attention_sinks=True,
        sliding_window=f.int("sliding_window", min=1), mixers=mixers, csa_ratio=csa,
        hca_ratio=hca, hc_mult=hc if hc != 1 else 0,
        hc_sinkhorn_iters=iters if hc != 1 else 0,
    )
    values["route_groups"], values["route_group_topk"] = _route_groups(f, experts, top_k)
    if csa:  # the indexer's sizes: only C layers have one
        values.update(index_heads=f.int("index_n_heads", min=1),
                      index_head_dim=f.int("index_head_dim", min=1),
                      index_topk=f.int("index_topk", min=1))
    values = _deepseek_router_bias(f, values)
    _check_kinds(f, values, {"mixers": "compress_ratios", "index_heads": "index_n_heads",
                             "kv_heads": "num_key_value_heads"})
    return values


def _v4_mixers(f: Fields, layers: int | None, mtp: int | None) -> tuple[str | None, int, int]:
    """(mixers, csa_ratio, hca_ratio) from DeepSeek-V4's compress_ratios: one entry per
    layer, then one per MTP module; 0 or 1 a sliding-window layer (W), 4 compressed sparse
    attention (C), a larger ratio heavily compressed attention (H, one ratio for all)."""
    raw = f.raw("compress_ratios")
    if raw is None or layers is None or mtp is None:
        return None, 0, 0
    if not isinstance(raw, list) or not all(type(x) is int and x >= 0 for x in raw):
        f.fail("compress_ratios", f"expected a list of integers >= 0, one per layer, got {_type_name(raw)}")
        return None, 0, 0
    if len(raw) not in (layers, layers + mtp):
        f.fail("compress_ratios", f"expected one entry per layer (num_hidden_layers {layers}), "
                                  f"then one per MTP module ({mtp}): got {len(raw)}")
        return None, 0, 0
    for i, ratio in enumerate(raw[layers:]):
        if ratio > 1:
            f.fail(f"compress_ratios[{layers + i}]", f"an MTP module with compressed attention "
                                                     f"(ratio {ratio}) is not modelled: expected 0")
            return None, 0, 0
    heavy = sorted({r for r in raw[:layers] if r > 1 and r != V4_CSA_RATIO})
    if len(heavy) > 1:
        f.fail("compress_ratios", f"expected one heavily compressed ratio besides "
                                  f"{V4_CSA_RATIO}, got {heavy}")
        return None, 0, 0
    pattern = "".join(SLIDING if r <= 1 else CSA if r == V4_CSA_RATIO else HCA for r in raw[:layers])
    return pattern, (V4_CSA_RATIO if CSA in pattern else 0), (heavy[0] if heavy else 0)


# DeepSeek-V4's inference code gives ratio 4, and only it, an indexer and overlapping windows
V4_CSA_RATIO = 4


def _read_kimi_k3(f: Fields) -> dict[str, Any]:
    """Kimi-K3 (its configuration_kimi_k3.py; SGLang's models/kimi_k3.py and kimi_k3_vl.py):
    Kimi Linear's text model with attention residuals and latent experts (text_config, model
    type kimi_linear: :func:`_read_kimi_linear`) and the MoonViT-V2 vision tower with its
    patchmergerv2 projector (vision_config)."""
    text = _sub_config(f, "text_config", ("kimi_linear",))
    values = _read_kimi_linear(text) if text is not None else {}
    vision_fields = _sub_config(f, "vision_config", ("kimi_k3_vision", "moonvit"))
    vision = (_moonvit_v2(vision_fields, values.get("hidden")) if vision_fields is not None else None)
    return {**_wrapper_tie(f, values, False), "vision": vision}


def _moonvit_v2(v: Fields, text_hidden: int | None) -> Vision | None:
    """MoonViT-V2 (Kimi-K3's vision_tower, SGLang kimi_k3_vl.py ``KimiK3VisionTower``): a
    bias-free Conv2d patch embedding, a learned init_pos_emb_height x init_pos_emb_width
    position table (the time embedding is a fixed sin-cos buffer), RMSNorm blocks of
    bias-free wqkv (hidden -> 3 x qkv_hidden_size) and wo, a plain GELU MLP, a final RMSNorm;
    the patchmergerv2 projector: merge^2 x hidden -> same -> text hidden, GELU between, no
    biases, an RMSNorm over its output (mm_projector.post_norm)."""
    before = len(v.problems)
    values = _moonvit_shape(v)
    values["attn_width"] = v.int("qkv_hidden_size", min=1, max=VISION_LIMITS["hidden"])
    for key, expected in (("mm_projector_type", "patchmergerv2"), ("norm_type", "rmsnorm"),
                          ("mlp_type", "mlp2")):
        got = v.str(key, expected)
        if got is not None and got != expected:
            v.fail(key, f"expected {expected} (Kimi-K3's), got {shown(got)}")
    mm_hidden = v.int("mm_hidden_size", None, min=1)
    if mm_hidden is not None and values["hidden"] is not None and mm_hidden != values["hidden"]:
        v.fail("mm_hidden_size", f"expected vt_hidden_size ({values['hidden']}), got {mm_hidden}")
    for key in ("attn_bias", "linear_bias", "patch_embed_proj_bias"):
        if v.bool(key, False):
            v.fail(key, "true is not supported: MoonViT-V2's linear layers are bias-free")
    attn, heads = values["attn_width"], values["heads"]
    if attn is not None and heads is not None and attn % heads:
        v.fail("qkv_hidden_size", f"expected a multiple of vt_num_attention_heads ({heads}), got {attn}")
    if text_hidden is not None and values["out_hidden"] is not None and values["out_hidden"] != text_hidden:
        v.fail("text_hidden_size", f"expected the language model's hidden_size ({text_hidden}), "
                                   f"got {values['out_hidden']}")
    if len(v.problems) > before:
        return None
    return Vision(**values, temporal_patch=1, channels=3, gated=False, norm=Norm.RMSNORM,
                  bias=False, final_norm=True, projector="mlp_post_norm")


_READERS: dict[str, Callable[[Fields], dict[str, Any]]] = {
    "deepseek_v2": _read_deepseek,
    "deepseek_v3": _read_deepseek,
    "deepseek_v32": _read_deepseek_v32,
    "deepseek_v4": _read_deepseek_v4,
    "gemma3": _read_gemma3,
    "gemma3_text": _read_gemma3_text,
    "gemma4": _read_gemma4,
    "glm_moe_dsa": _read_glm_moe_dsa,
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
    "gpt_oss": _read_gpt_oss,
    "kimi_k25": _read_kimi_k25,
    "kimi_k3": _read_kimi_k3,
    "kimi_linear": _read_kimi_linear,
    "llama": _read_llama,
    "minimax_m2": _read_minimax_m2,
    "mistral": _read_mistral,
    "mixtral": _read_mixtral,
    "nemotron_h": _read_nemotron_h,
    "qwen2": _read_qwen2,
    "qwen2_moe": _read_qwen2_moe,
    "qwen3": _read_qwen3,
    "qwen3_5": _read_qwen3_5,
    "qwen3_5_moe": _read_qwen3_5_moe,
    "qwen3_moe": _read_qwen3_moe,
    "qwen3_next": _read_qwen3_next,
    "qwen3_vl": _read_qwen3_vl,
    "qwen3_vl_moe": _read_qwen3_vl_moe,
}
# families whose configs are known and refused by name: what they need is not modelled
_REFUSED: dict[str, Callable[[Fields], dict[str, Any]]] = {
}
# multimodal wrappers: the language model's keys sit under text_config
_WRAPPERS = frozenset({"gemma3", "gemma4", "kimi_k25", "kimi_k3", "qwen3_5", "qwen3_5_moe", "qwen3_vl",
                       "qwen3_vl_moe"})


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
# attention over a window or in chunks costs less than the full causal attention counted.
# The families read into per-layer kinds (Model.mixers: gpt-oss, Gemma 4, Qwen3-Next ...)
# read sliding_window and layer_types: those are not noted for them.
UNMODELLED = {
    "sliding_window": "sliding-window attention (counted as full causal attention)",
    "attention_chunk_size": "chunked attention (counted as full causal attention)",
    "layer_types": "per-layer attention types (every layer counted as full attention)",
}


_READ_AS_KINDS = frozenset({"sliding_window", "layer_types"})


def import_notes(data: Any, model: Model, label: str) -> list[str]:
    """What was imported from a config.json, and what of it is not modelled."""
    kv = f" ({model.kv_heads} kv)" if model.kv_heads != model.heads else ""
    experts = f", {model.experts} experts (top {model.top_k})" if model.is_moe else ""
    notes = [f"imported {label} ({data.get('model_type')}): {model.layers} layers, hidden "
             f"{model.hidden}, {model.heads} heads{kv}{experts}, "
             f"{model.params_total / 1e9:.2f}B parameters"]
    read = _READ_AS_KINDS if model.mixers else frozenset()
    for key, what in UNMODELLED.items():
        value = data.get(key)
        if value is None or (key == "sliding_window" and data.get("use_sliding_window") is False):
            continue
        if key in read:
            continue
        notes.append(f"{label}: {key} is not modelled: {what}")
    return notes
