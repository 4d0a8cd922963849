"""Importing HuggingFace config.json files as autoplan Models.

The fixtures in tests/data/hf/ reproduce the official config.json of each model
(huggingface.co/<repo>/blob/main/config.json): meta-llama/Meta-Llama-3-8B,
mistralai/Mistral-7B-v0.1, Qwen/Qwen2-7B, openai-community/gpt2 and
EleutherAI/gpt-neox-20b. Official files carry no ``_name_or_path``, so each model
is named after its fixture file.

Published parameter counts (the reference the tests check against, within 1 %):

| model           | published | source                                                |
| --------------- | --------- | ----------------------------------------------------- |
| Llama-3-8B      | 8.03 B    | Hub model page (safetensors: 8,030,261,248)           |
| Mistral-7B-v0.1 | 7.24 B    | Hub model page (safetensors: 7,241,732,096)           |
| Qwen2-7B        | 7.62 B    | Hub model page (safetensors: 7,615,616,512)           |
| GPT-2           | 124 M     | Hub model page (safetensors: 124,439,808)             |
| GPT-NeoX-20B    | 20.55 B   | model card / Black et al. 2022 (20,554,567,680)       |

The configs are inputs; the counts are predictions of Model's formulas, never
fed back in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoplan.descriptors.hf import is_hf_config, model_from_hf_config
from autoplan.errors import InputError
from autoplan.vocab import Activation, Norm, Position

DATA = Path(__file__).parent / "data" / "hf"


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


def test_qwen2_7b_count_falls_short_of_the_checkpoint_by_exactly_its_qkv_biases():
    # Model.bias is one flag for every linear layer; Qwen2 biases q/k/v only, so
    # the import leaves those out: (28 + 2 * 4) heads * 128 per layer, 28 layers.
    model = _import("Qwen2-7B")
    assert model.bias is False
    qkv_biases = model.layers * (model.q_dim + 2 * model.kv_dim)
    assert 7_615_616_512 - model.params_total == qkv_biases == 129_024


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
    for family in ("gpt2", "gpt_neox", "llama", "mistral", "qwen2"):
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
