"""Importing HuggingFace config.json files as autoplan Models.

The fixtures in tests/data/hf/ reproduce the official config.json of each model
(huggingface.co/<repo>/blob/main/config.json): meta-llama/Meta-Llama-3-8B,
mistralai/Mistral-7B-v0.1, Qwen/Qwen2-7B, openai-community/gpt2,
EleutherAI/gpt-neox-20b, mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen1.5-MoE-A2.7B,
Qwen/Qwen3-235B-A22B, deepseek-ai/DeepSeek-V3 and deepseek-ai/DeepSeek-V2-Lite.
Official files carry no ``_name_or_path``, so each model is named after its
fixture file. The MoE fixtures keep keys autoplan never reads (rope_scaling,
quantization_config, auto_map, router loss coefficients) to show they are ignored.

Published parameter counts (the reference the tests check against, within 1 %):

| model             | published           | source                                          |
| ----------------- | ------------------- | ----------------------------------------------- |
| Llama-3-8B        | 8.03 B              | Hub model page (safetensors: 8,030,261,248)     |
| Mistral-7B-v0.1   | 7.24 B              | Hub model page (safetensors: 7,241,732,096)     |
| Qwen2-7B          | 7.62 B              | Hub model page (safetensors: 7,615,616,512)     |
| GPT-2             | 124 M               | Hub model page (safetensors: 124,439,808)       |
| GPT-NeoX-20B      | 20.55 B             | model card / Black et al. 2022 (20,554,567,680) |
| Mixtral-8x7B      | 46.7 B, 12.9 B act. | Mistral AI, "Mixtral of experts" (Dec 2023)     |
| Qwen1.5-MoE-A2.7B | 14.3 B, 2.7 B act.  | model card / Qwen blog "Qwen1.5-MoE" (2024)     |
| Qwen3-235B-A22B   | 235 B, 22 B act.    | Qwen3 Technical Report, Table 2                 |
| DeepSeek-V3       | 671 B, 36.7 B act.  | report abstract; HF README_WEIGHTS.md           |
| DeepSeek-V2-Lite  | 15.7 B              | model card (DeepSeek-AI 2024)                   |

Exact counts marked "transformers" come from building each fixture's model in
transformers 5.23 on the meta device (sum of ``numel`` over parameters), done
once by hand: a count of the real module tree, independent of Model's formulas.

The configs are inputs; the counts are predictions of Model's formulas, never
fed back in.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from autoplan.descriptors.hf import is_hf_config, model_from_hf_config
from autoplan.descriptors.library import resolve_model
from autoplan.errors import InputError
from autoplan.vocab import Activation, Norm, Position

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"


def _load(stem: str) -> tuple[dict[str, Any], str]:
    path = DATA / f"{stem}.json"
    return json.loads(path.read_text(encoding="utf-8")), str(path)


def _import(stem: str):
    data, source = _load(stem)
    return model_from_hf_config(data, source)


def _tiny_llama(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 688,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


# -- reference: published parameter counts -------------------------------------------


def test_llama3_8b_config_gives_the_published_8_03b_parameters():
    assert _import("Meta-Llama-3-8B").params_total == pytest.approx(8.03e9, rel=0.01)


def test_mistral_7b_config_gives_the_published_7_24b_parameters():
    assert _import("Mistral-7B-v0.1").params_total == pytest.approx(7.24e9, rel=0.01)


def test_qwen2_7b_config_gives_the_published_7_62b_parameters():
    assert _import("Qwen2-7B").params_total == pytest.approx(7.62e9, rel=0.01)


def test_gpt2_config_gives_the_published_124m_parameters():
    assert _import("gpt2").params_total == pytest.approx(124e6, rel=0.01)


def test_gpt_neox_20b_config_gives_the_published_20_55b_parameters():
    assert _import("gpt-neox-20b").params_total == pytest.approx(20.55e9, rel=0.01)


def test_qwen2_7b_count_is_the_checkpoints_exactly_with_its_qkv_biases():
    # Qwen2 biases q/k/v only (Model.qkv_bias; bias would put them on every linear
    # layer): (28 + 2 * 4) heads * 128 per layer, 28 layers, 129,024 in all.
    model = _import("Qwen2-7B")
    assert model.bias is False and model.qkv_bias is True
    qkv_biases = model.layers * (model.q_dim + 2 * model.kv_dim)
    assert qkv_biases == 129_024
    assert model.params_total == 7_615_616_512
    assert dataclasses.replace(model, qkv_bias=False).params_total == 7_615_616_512 - qkv_biases


# -- architecture read from the config -------------------------------------------------


def test_llama3_8b_is_a_gqa_swiglu_rope_rmsnorm_model_with_an_untied_head():
    model = _import("Meta-Llama-3-8B")
    assert (model.layers, model.hidden, model.heads, model.kv_heads) == (32, 4096, 32, 8)
    assert (model.ffn_hidden, model.vocab, model.max_seq_len) == (14336, 128256, 8192)
    assert model.activation is Activation.SWIGLU
    assert model.position is Position.ROPE
    assert model.norm is Norm.RMSNORM
    assert model.tied_embeddings is False
    assert model.bias is False
    assert model.dropout is False
    assert model.head_dim == 0


def test_gpt2_has_learned_positions_layernorm_biases_dropout_and_a_tied_head():
    model = _import("gpt2")
    assert (model.layers, model.hidden, model.heads, model.kv_heads) == (12, 768, 12, 12)
    assert model.ffn_hidden == 4 * 768  # n_inner absent -> 4 * n_embd
    assert model.activation is Activation.GELU
    assert model.position is Position.LEARNED
    assert model.norm is Norm.LAYERNORM
    assert model.tied_embeddings is True
    assert model.bias is True
    assert model.dropout is True  # resid_pdrop 0.1
    assert model.max_seq_len == 1024


def test_gpt_neox_20b_is_a_plain_gelu_rope_model_with_biases_and_no_dropout():
    # The file's attention_probs_dropout_prob/hidden_dropout_prob are legacy keys
    # transformers does not read; its attention_dropout/hidden_dropout default to 0.
    model = _import("gpt-neox-20b")
    assert (model.layers, model.hidden, model.heads, model.ffn_hidden) == (44, 6144, 64, 24576)
    assert model.activation is Activation.GELU
    assert model.position is Position.ROPE
    assert model.norm is Norm.LAYERNORM
    assert model.tied_embeddings is False
    assert model.bias is True
    assert model.dropout is False


def test_neox_rotary_pct_does_not_change_the_parameter_count():
    data, source = _load("gpt-neox-20b")
    full = model_from_hf_config({**data, "rotary_pct": 1.0}, source)
    assert full.params_total == model_from_hf_config(data, source).params_total


def test_llama_with_an_unusual_intermediate_size_is_still_swiglu():
    # 4 * hidden is the classic non-gated ratio; the family and hidden_act decide.
    model = model_from_hf_config(_tiny_llama(intermediate_size=4 * 256), "tiny.json")
    assert model.activation is Activation.SWIGLU
    assert model.mlp_matrices == 3


def test_gpt2_and_neox_with_a_gated_looking_ratio_are_still_plain_gelu():
    gpt2, source = _load("gpt2")
    neox, neox_source = _load("gpt-neox-20b")
    assert model_from_hf_config({**gpt2, "n_inner": 2048}, source).activation is Activation.GELU
    neox_8_3 = {**neox, "intermediate_size": 16384}  # 8/3 * 6144, the SwiGLU ratio
    assert model_from_hf_config(neox_8_3, neox_source).activation is Activation.GELU


def test_llama_family_with_a_gelu_activation_is_geglu():
    model = model_from_hf_config(_tiny_llama(hidden_act="gelu_pytorch_tanh"), "tiny.json")
    assert model.activation is Activation.GEGLU


def test_llama_family_with_a_non_glu_activation_is_refused_naming_hidden_act():
    with pytest.raises(InputError) as caught:
        model_from_hf_config(_tiny_llama(hidden_act="relu"), "tiny.json")
    assert [p.field for p in caught.value.problems] == ["hidden_act"]
    assert "'relu'" in str(caught.value)


def test_unknown_keys_in_a_hf_config_are_ignored():
    model = model_from_hf_config(_tiny_llama(some_future_key={"x": 1}), "tiny.json")
    assert model.layers == 2


def test_llama_without_num_key_value_heads_is_multi_head_attention():
    model = model_from_hf_config(_tiny_llama(num_key_value_heads=None), "tiny.json")
    assert model.kv_heads == model.heads == 4


def test_mistral_without_num_key_value_heads_is_refused_not_defaulted():
    # MistralConfig would silently assume 8, Mistral-7B's value.
    data, source = _load("Mistral-7B-v0.1")
    del data["num_key_value_heads"]
    with pytest.raises(InputError) as caught:
        model_from_hf_config(data, source)
    assert [p.field for p in caught.value.problems] == ["num_key_value_heads"]


def test_tie_word_embeddings_defaults_to_each_config_class_default():
    llama = model_from_hf_config(_tiny_llama(), "tiny.json")
    gpt2, source = _load("gpt2")
    assert "tie_word_embeddings" not in gpt2
    assert llama.tied_embeddings is False
    assert model_from_hf_config(gpt2, source).tied_embeddings is True


def test_an_explicit_head_dim_other_than_hidden_over_heads_is_kept():
    # Mistral-Nemo: hidden 5120, 32 heads of 128 (not 160).
    model = model_from_hf_config(
        _tiny_llama(hidden_size=5120, num_attention_heads=32, num_key_value_heads=8, head_dim=128),
        "nemo.json",
    )
    assert model.head_dim == 128
    assert model.q_dim == 4096


def test_a_head_dim_equal_to_hidden_over_heads_is_left_implicit():
    assert model_from_hf_config(_tiny_llama(head_dim=64), "tiny.json").head_dim == 0


def test_llama_bias_needs_both_attention_and_mlp_biases():
    both = model_from_hf_config(_tiny_llama(attention_bias=True, mlp_bias=True), "t.json")
    attention_only = model_from_hf_config(_tiny_llama(attention_bias=True), "t.json")
    assert both.bias is True
    assert attention_only.bias is False


def test_attention_dropout_above_zero_sets_dropout():
    assert model_from_hf_config(_tiny_llama(attention_dropout=0.1), "t.json").dropout is True


# -- names -----------------------------------------------------------------------------


def test_the_name_argument_wins_over_name_or_path_and_the_file_name():
    config = _tiny_llama(_name_or_path="org/tiny")
    assert model_from_hf_config(config, "x/tiny.json", name="mine").name == "mine"
    assert model_from_hf_config(config, "x/tiny.json").name == "org/tiny"


def test_without_name_or_path_the_model_is_named_after_the_file():
    assert _import("Mistral-7B-v0.1").name == "Mistral-7B-v0.1"
    assert model_from_hf_config(_tiny_llama(_name_or_path=""), "x/tiny.json").name == "tiny"


def test_a_file_called_config_json_is_named_after_its_folder():
    source = "/models/Meta-Llama-3-8B/config.json"
    assert model_from_hf_config(_tiny_llama(), source).name == "Meta-Llama-3-8B"


# -- errors ----------------------------------------------------------------------------


def test_an_unsupported_model_type_names_the_file_the_field_and_the_supported_ones():
    data = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 768}
    with pytest.raises(InputError) as caught:
        model_from_hf_config(data, "models/bert/config.json")
    message = str(caught.value)
    assert message.startswith("models/bert/config.json: model_type: ")
    assert "'bert'" in message
    for family in ("deepseek_v2", "deepseek_v3", "gpt2", "gpt_neox", "llama", "mistral",
                   "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        assert family in message


def test_a_missing_key_and_a_string_for_a_number_are_reported_together():
    config = _tiny_llama(num_hidden_layers=None, hidden_size="4096")
    with pytest.raises(InputError) as caught:
        model_from_hf_config(config, "broken.json")
    fields = {p.field: p.message for p in caught.value.problems}
    assert set(fields) == {"num_hidden_layers", "hidden_size"}
    assert "missing" in fields["num_hidden_layers"]
    assert "string '4096'" in fields["hidden_size"]
    assert all(p.source == "broken.json" for p in caught.value.problems)


def test_a_missing_model_type_is_reported_with_the_supported_families():
    config = _tiny_llama()
    del config["model_type"]
    with pytest.raises(InputError) as caught:
        model_from_hf_config({**config, "architectures": ["LlamaForCausalLM"]}, "c.json")
    assert [p.field for p in caught.value.problems] == ["model_type"]
    assert "llama" in caught.value.problems[0].message


def test_kv_heads_that_do_not_divide_heads_are_refused_on_the_hf_key():
    with pytest.raises(InputError) as caught:
        model_from_hf_config(_tiny_llama(num_key_value_heads=3), "t.json")
    assert [p.field for p in caught.value.problems] == ["num_key_value_heads"]


def test_gpt2_heads_that_do_not_divide_n_embd_are_refused_on_n_head():
    gpt2, source = _load("gpt2")
    with pytest.raises(InputError) as caught:
        model_from_hf_config({**gpt2, "n_head": 7}, source)
    assert [p.field for p in caught.value.problems] == ["n_head"]
    assert "n_embd (768)" in caught.value.problems[0].message


def test_a_config_that_is_not_a_mapping_is_refused():
    with pytest.raises(InputError):
        model_from_hf_config(["llama"], "list.json")


# -- detection -------------------------------------------------------------------------


def test_is_hf_config_recognises_hf_configs_and_not_autoplan_descriptors():
    llama, _ = _load("Meta-Llama-3-8B")
    assert is_hf_config(llama)
    assert is_hf_config({"architectures": ["LlamaForCausalLM"]})
    assert not is_hf_config({"model": {"name": "llama3-8b", "layers": 32}})
    assert not is_hf_config(["model_type"])


# -- mixtures of experts: published counts ----------------------------------------------


def test_mixtral_8x7b_config_gives_the_published_46_7b_total_and_12_9b_active():
    model = _import("Mixtral-8x7B-v0.1")
    assert model.params_total == pytest.approx(46.7e9, rel=0.01)
    assert model.params_active == pytest.approx(12.9e9, rel=0.01)
    # transformers: 46,702,792,704, the count of the official checkpoint too
    assert model.params_total == 46_702_792_704


def test_qwen1_5_moe_config_gives_the_published_14_3b_total_and_2_7b_active():
    model = _import("Qwen1.5-MoE-A2.7B")
    assert model.params_total == pytest.approx(14.3e9, rel=0.01)
    assert model.params_active == pytest.approx(2.7e9, rel=0.01)


def test_qwen1_5_moe_count_falls_short_by_exactly_its_qkv_biases_and_shared_expert_gates():
    # transformers: 14,315,784,192. Model has no q/k/v-only biases and no
    # shared_expert_gate (hidden -> 1 per sparse layer); see _read_qwen2_moe.
    model = _import("Qwen1.5-MoE-A2.7B")
    qkv_biases = model.layers * (model.q_dim + 2 * model.kv_dim)
    gates = model.moe_layers * model.hidden
    assert 14_315_784_192 - model.params_total == qkv_biases + gates == 196_608


def test_qwen3_235b_config_gives_the_published_235b_total_and_22b_active():
    model = _import("Qwen3-235B-A22B")
    assert model.params_total == pytest.approx(235e9, rel=0.01)
    assert model.params_active == pytest.approx(22e9, rel=0.01)
    assert model.params_total == 235_093_634_560  # transformers


def test_deepseek_v3_config_gives_the_published_671b_total_without_its_mtp_module():
    model = _import("DeepSeek-V3")
    assert model.params_total == pytest.approx(671e9, rel=0.01)
    # transformers (which builds no MTP module; its router bias is a buffer)
    assert model.params_total == 671_026_404_352


def test_deepseek_v3_active_count_matches_the_published_36_7b_without_the_input_embedding():
    # DeepSeek's activated figures (V2 21B, V2-Lite 2.4B, V3 37B; README_WEIGHTS.md
    # 36.7B) agree with the count less the input-embedding table, whose lookup reads
    # one row per token. README_WEIGHTS' parenthesis says the 36.7B includes the
    # embedding; with it the count is 37.55B (2.3 % over), which we cannot reconcile.
    model = _import("DeepSeek-V3")
    assert model.params_active - model.vocab * model.hidden == pytest.approx(36.7e9, rel=0.01)


def test_deepseek_v2_lite_config_gives_the_published_15_7b_total():
    model = _import("DeepSeek-V2-Lite")
    assert model.params_total == pytest.approx(15.7e9, rel=0.01)
    assert model.params_total == 15_706_484_224  # transformers


# -- mixtures of experts: architecture read from the config -----------------------------


def test_mixtral_every_layer_routes_to_2_of_8_experts_of_intermediate_size():
    model = _import("Mixtral-8x7B-v0.1")
    assert (model.experts, model.top_k, model.shared_experts) == (8, 2, 0)
    assert model.expert_width == model.ffn_hidden == 14336
    assert model.moe_layers == model.layers == 32
    assert (model.activation, model.kv_heads, model.tied_embeddings) == (Activation.SWIGLU, 8, False)


def test_qwen2_moe_has_one_shared_expert_of_its_own_width_and_no_dense_layer():
    model = _import("Qwen1.5-MoE-A2.7B")
    assert (model.experts, model.top_k, model.expert_width) == (60, 4, 1408)
    assert (model.shared_experts, model.shared_width) == (1, 5632)
    assert model.dense_layers == 0
    assert model.bias is False  # q/k/v only: see the shortfall test above
    assert model.qk_norm is False


def test_qwen3_moe_has_q_k_norms_an_explicit_head_dim_and_no_shared_expert():
    model = _import("Qwen3-235B-A22B")
    assert model.qk_norm is True
    assert model.head_dim == 128 and model.q_dim == 8192  # 64 heads x 128, not 4096
    assert (model.experts, model.top_k, model.expert_width, model.shared_experts) == (128, 8, 1536, 0)
    assert model.dense_layers == 0 and model.ffn_hidden == 12288


def test_deepseek_v3_has_mla_three_dense_layers_one_shared_expert_and_one_mtp_module():
    model = _import("DeepSeek-V3")
    assert model.is_mla and model.kv_heads == model.heads == 128
    assert (model.q_lora_rank, model.kv_lora_rank) == (1536, 512)
    assert (model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim) == (128, 64, 128)
    assert (model.dense_layers, model.ffn_hidden, model.moe_layers) == (3, 18432, 58)
    assert (model.experts, model.top_k, model.expert_width, model.shared_experts) == (256, 8, 2048, 1)
    assert model.mtp_layers == 1


def test_deepseek_v2_lite_null_q_lora_rank_projects_queries_directly():
    model = _import("DeepSeek-V2-Lite")
    assert model.q_lora_rank == 0
    assert (model.dense_layers, model.shared_experts, model.mtp_layers) == (1, 2, 0)
    h, n = model.hidden, model.heads
    direct_q = h * n * (128 + 64)
    kv = h * (512 + 64) + 512 + 512 * n * (128 + 128)
    assert model.params_mla == direct_q + kv + n * 128 * h


@pytest.mark.parametrize(("stem", "builtin"), [
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("Qwen3-235B-A22B", "qwen3-235b-a22b"),
    ("DeepSeek-V3", "deepseek-v3"),
])
def test_importing_the_config_gives_the_built_in_profile(stem, builtin):
    expected = resolve_model(builtin)
    assert _import(stem) == dataclasses.replace(expected, name=stem)


def test_deepseek_v3_file_without_num_nextn_predict_layers_has_no_mtp_module():
    # transformers' DeepseekV3Config has no such key and builds no MTP module.
    data, source = _load("DeepSeek-V3")
    del data["num_nextn_predict_layers"]
    assert model_from_hf_config(data, source).mtp_layers == 0


def test_deepseek_v3_keys_read_as_deepseek_v2_give_the_same_model():
    data, source = _load("DeepSeek-V3")
    v2 = model_from_hf_config({**data, "model_type": "deepseek_v2"}, source)
    assert v2 == model_from_hf_config(data, source)


def test_deepseek_without_dense_layers_needs_no_intermediate_size():
    data, source = _load("DeepSeek-V3")
    del data["intermediate_size"]
    model = model_from_hf_config({**data, "first_k_dense_replace": 0}, source)
    assert model.dense_layers == 0 and model.moe_layers == 61


def test_qwen_mlp_only_layers_forming_a_leading_block_become_dense_layers():
    data, source = _load("Qwen3-235B-A22B")
    sparse = model_from_hf_config(data, source)
    model = model_from_hf_config({**data, "mlp_only_layers": [2, 0, 1]}, source)
    assert model.dense_layers == 3
    # three sparse blocks become dense MLPs of intermediate_size
    dense_mlp = 3 * model.hidden * 12288
    sparse_mlp = model.params_router + 128 * model.params_expert
    assert model.params_total - sparse.params_total == 3 * (dense_mlp - sparse_mlp)


def test_qwen_decoder_sparse_step_equal_to_the_layer_count_leaves_only_the_last_layer_sparse():
    # (i + 1) % 94 == 0 only for i = 93: layers 0..92 dense, a leading block.
    data, source = _load("Qwen3-235B-A22B")
    model = model_from_hf_config({**data, "decoder_sparse_step": 94}, source)
    assert (model.dense_layers, model.moe_layers) == (93, 1)


def test_qwen2_moe_without_intermediate_size_is_accepted_when_no_layer_is_dense():
    data, source = _load("Qwen1.5-MoE-A2.7B")
    del data["intermediate_size"]
    model = model_from_hf_config(data, source)
    assert model.params_total == _import("Qwen1.5-MoE-A2.7B").params_total


def test_qwen3_dense_has_q_k_norms_and_its_head_dim():
    config = _tiny_llama(model_type="qwen3", head_dim=128, tie_word_embeddings=True)
    model = model_from_hf_config(config, "qwen3.json")
    assert model.qk_norm is True and model.head_dim == 128 and not model.is_moe
    assert model.params_attention == 2 * 256 * 4 * 128 + 2 * 256 * 2 * 128 + 2 * 128


# -- mixtures of experts: refused inputs ----------------------------------------------------


def _refused(data: dict[str, Any], source: str) -> dict[str, str]:
    """Every problem's field -> message; each message names the file first."""
    with pytest.raises(InputError) as caught:
        model_from_hf_config(data, source)
    for problem in caught.value.problems:
        assert str(problem).startswith(f"{source}: {problem.field}: ")
    return {p.field: p.message for p in caught.value.problems}


def test_mixtral_without_num_local_experts_is_refused_naming_the_file_and_key():
    data, source = _load("Mixtral-8x7B-v0.1")
    del data["num_local_experts"]
    assert _refused(data, source) == {"num_local_experts": "missing required field"}


def test_more_experts_per_token_than_experts_is_refused_on_num_experts_per_tok():
    data, source = _load("Mixtral-8x7B-v0.1")
    problems = _refused({**data, "num_experts_per_tok": 9}, source)
    assert list(problems) == ["num_experts_per_tok"]
    assert "num_local_experts (8)" in problems["num_experts_per_tok"]


def test_deepseek_moe_layer_freq_other_than_1_is_refused_not_approximated():
    data, source = _load("DeepSeek-V3")
    problems = _refused({**data, "moe_layer_freq": 2}, source)
    assert list(problems) == ["moe_layer_freq"]
    assert "expected 1, got 2" in problems["moe_layer_freq"]


def test_deepseek_kv_heads_other_than_heads_are_refused():
    data, source = _load("DeepSeek-V3")
    problems = _refused({**data, "num_key_value_heads": 8}, source)
    assert list(problems) == ["num_key_value_heads"]
    assert "num_attention_heads (128)" in problems["num_key_value_heads"]


def test_deepseek_without_q_lora_rank_is_refused_but_null_is_accepted():
    data, source = _load("DeepSeek-V3")
    absent = {k: v for k, v in data.items() if k != "q_lora_rank"}
    problems = _refused(absent, source)
    assert list(problems) == ["q_lora_rank"]
    assert "null if the model has none" in problems["q_lora_rank"]
    assert model_from_hf_config({**data, "q_lora_rank": None}, source).q_lora_rank == 0


def test_deepseek_dense_layers_need_intermediate_size():
    data, source = _load("DeepSeek-V3")
    del data["intermediate_size"]
    problems = _refused(data, source)
    assert list(problems) == ["intermediate_size"]
    assert "3 dense layers (first_k_dense_replace)" in problems["intermediate_size"]


def test_deepseek_with_every_layer_dense_is_refused_on_first_k_dense_replace():
    data, source = _load("DeepSeek-V3")
    problems = _refused({**data, "first_k_dense_replace": 61}, source)
    assert list(problems) == ["first_k_dense_replace"]


def test_deepseek_missing_sizes_are_all_reported_together():
    data, source = _load("DeepSeek-V3")
    for key in ("n_routed_experts", "moe_intermediate_size", "kv_lora_rank", "n_shared_experts"):
        del data[key]
    assert set(_refused(data, source)) == {
        "n_routed_experts", "moe_intermediate_size", "kv_lora_rank", "n_shared_experts"
    }


def test_qwen_decoder_sparse_step_interleaving_dense_layers_is_refused():
    data, source = _load("Qwen1.5-MoE-A2.7B")
    problems = _refused({**data, "decoder_sparse_step": 2}, source)
    assert list(problems) == ["decoder_sparse_step"]
    assert "dense layers [0, 2, 4" in problems["decoder_sparse_step"]
    assert "not a leading block" in problems["decoder_sparse_step"]


def test_qwen_mlp_only_layers_after_a_sparse_layer_are_refused():
    data, source = _load("Qwen3-235B-A22B")
    problems = _refused({**data, "mlp_only_layers": [0, 5]}, source)
    assert list(problems) == ["mlp_only_layers"]
    assert "[0, 5]" in problems["mlp_only_layers"]


def test_qwen_mlp_only_layers_beyond_the_last_layer_are_refused():
    data, source = _load("Qwen3-235B-A22B")
    problems = _refused({**data, "mlp_only_layers": [94]}, source)
    assert list(problems) == ["mlp_only_layers"]
    assert "below num_hidden_layers (94)" in problems["mlp_only_layers"]


def test_qwen_mlp_only_layers_covering_every_layer_are_refused():
    data, source = _load("Qwen1.5-MoE-A2.7B")
    problems = _refused({**data, "mlp_only_layers": list(range(24))}, source)
    assert list(problems) == ["mlp_only_layers"]
    assert "no mixture-of-experts layer" in problems["mlp_only_layers"]


def test_qwen2_moe_dense_layers_need_intermediate_size():
    data, source = _load("Qwen1.5-MoE-A2.7B")
    del data["intermediate_size"]
    problems = _refused({**data, "mlp_only_layers": [0]}, source)
    assert list(problems) == ["intermediate_size"]


def test_qwen3_moe_without_num_key_value_heads_is_refused_not_defaulted():
    # Qwen3MoeConfig would silently assume 4.
    data, source = _load("Qwen3-235B-A22B")
    del data["num_key_value_heads"]
    problems = _refused(data, source)
    assert list(problems) == ["num_key_value_heads"]
    assert "would assume 4" in problems["num_key_value_heads"]


def test_qwen3_moe_derives_a_missing_head_dim_but_qwen3_dense_requires_it():
    data, source = _load("Qwen3-235B-A22B")
    del data["head_dim"]
    assert model_from_hf_config(data, source).kv_channels == 4096 // 64
    problems = _refused(_tiny_llama(model_type="qwen3"), "qwen3.json")
    assert list(problems) == ["head_dim"]
    assert "would assume 128" in problems["head_dim"]


def test_a_config_names_its_model_only_with_characters_a_name_may_hold(tmp_path):
    # issue 34, items 2 and 6: _name_or_path is refused as any loaded name is; a name taken
    # from the file's folder keeps only what a terminal or a YAML file cannot misread
    data, source = _load("Meta-Llama-3-8B")
    with pytest.raises(InputError, match="_name_or_path: expected a name without control"):
        model_from_hf_config({**data, "_name_or_path": "meta\x1b]0;pwn\x07"}, source)
    clean = {k: v for k, v in data.items() if k != "_name_or_path"}
    model = model_from_hf_config(clean, str(tmp_path / "ev\x1b[2Jil\u2028x" / "config.json"))
    assert model.name == "ev [2Jil x"
