"""Reference tests: parameter and FLOP counts against published numbers and
closed forms worked by hand. Each cites its source and tolerance."""

from __future__ import annotations

import pytest

from autoplan.descriptors.library import resolve_model
from autoplan.kernels import flops


@pytest.mark.parametrize(
    ("name", "published"),
    [
        # Narayanan et al. SC'21, Table 2 (GPT-3 174.6B)
        ("gpt3-175b", 174.6e9),
        # Llama 3 model cards / checkpoint sizes (Meta, 2024)
        ("llama3-8b", 8.03e9),
        ("llama3-70b", 70.55e9),
        ("llama3-405b", 405.85e9),
        # Llama 3.1 / 3.3 model cards: Llama 3's architectures with a 128K context window
        ("llama3.1-8b", 8.03e9),
        ("llama3.1-70b", 70.55e9),
        ("llama3.3-70b", 70.55e9),
        # DeepSeek-V3 technical report (abstract) and DeepSeek-R1 (trained from V3-Base): 671B
        ("deepseek-r1", 671e9),
        # Llama 2 paper (Touvron et al. 2023), checkpoint sizes
        ("llama2-7b", 6.74e9),
        ("llama2-70b", 68.98e9),
        ("llama2-13b", 13.02e9),
    ],
)
def test_parameter_count_is_within_one_percent_of_the_published_total(name, published):
    assert resolve_model(name).params_total == pytest.approx(published, rel=0.01)


def test_qwen25_counts_equal_the_published_checkpoints_exactly_with_their_qkv_biases():
    """Qwen2.5-7B and -72B: 7,615,616,512 and 72,706,203,648 parameters (the HF
    checkpoints' safetensors totals, 7.61B and 72.7B on the model cards). By hand for 7B:
    two untied 152,064 x 3,584 embeddings 1,089,994,752; a layer's Q/O 2 x 3,584^2, K/V
    2 x 3,584 x 512, Q/K/V biases 3,584 + 2 x 512, MLP 3 x 3,584 x 18,944, two norms:
    233,057,792, x 28; the final norm 3,584. Without the Q/K/V biases it is 129,024 short."""
    per_layer = 2 * 3584**2 + 2 * 3584 * 512 + (3584 + 2 * 512) + 3 * 3584 * 18944 + 2 * 3584
    assert per_layer == 233_057_792
    assert resolve_model("qwen2.5-7b").params_total == 2 * 152064 * 3584 + 28 * per_layer + 3584 \
        == 7_615_616_512
    assert resolve_model("qwen2.5-72b").params_total == 72_706_203_648


def test_qwen2_configs_read_from_huggingface_carry_their_qkv_biases():
    from autoplan.descriptors.hf import model_from_hf_config

    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 28,
              "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
              "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
              "hidden_act": "silu", "tie_word_embeddings": False}
    model = model_from_hf_config(config, "config.json", "qwen2.5-7b-hf")
    assert model.qkv_bias and not model.bias
    assert model.params_total == resolve_model("qwen2.5-7b").params_total


@pytest.mark.parametrize(
    ("name", "layers", "hidden"),
    [("gpt-7.5b", 36, 4096), ("gpt-39b", 48, 8192), ("gpt-145b", 80, 12288), ("gpt-1t", 128, 25600)],
)
def test_megatron_gpt_family_matches_the_papers_parameter_formula(name, layers, hidden):
    """Narayanan et al. SC'21 eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)),
    which leaves out the final LayerNorm (2h) that autoplan counts."""
    v, s = 51200, 2048
    paper = 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (v + s) / (12 * layers * hidden))
    model = resolve_model(name)
    assert model.params_total == pytest.approx(paper + 2 * hidden, rel=1e-9)


def test_gpt3_model_flops_equal_the_sc21_formula_when_attention_is_not_causal():
    """SC'21 eq. 3 without recompute: F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    m = resolve_model("gpt3-175b")
    b, s, l, h, v = 1536, 2048, 96, 12288, 51200
    expected = 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    got = flops.model_flops_per_step(m, tokens=b * s, seq_len=s, causal=False)
    assert got == pytest.approx(expected, rel=1e-12)


def test_causal_attention_halves_only_the_attention_term():
    m = resolve_model("gpt3-175b")
    b, s, l, h, v = 8, 2048, 96, 12288, 51200
    expected = 72 * b * s * l * h**2 * (1 + s / (12 * h) + v / (12 * l * h))
    got = flops.model_flops_per_step(m, tokens=b * s, seq_len=s, causal=True)
    assert got == pytest.approx(expected, rel=1e-12)


def test_llama3_8b_flops_follow_megatrons_gqa_and_swiglu_terms_worked_by_hand():
    """Megatron-LM num_floating_point_operations (GQA, SwiGLU, causal attention),
    worked here term by term for llama3-8b (h 4096, a 32, g 8, f 14336, V 128256)."""
    m = resolve_model("llama3-8b")
    s, l, h, f, v = 8192, 32, 4096, 14336, 128256
    per_token_fwd = l * (
        2 * (h * h + 2 * h * 1024 + h * h)  # Q, K, V (GQA: 8 x 128), O
        + 2 * 3 * h * f  # gate, up, down
        + 2 * s * h  # causal QK^T and AV: 2 * 2 * s * h / 2
    ) + 2 * h * v
    assert flops.model_flops_per_step(m, tokens=s, seq_len=s) == pytest.approx(3 * per_token_fwd * s)


def test_full_recompute_adds_one_forward_of_the_layers():
    m = resolve_model("gpt3-175b")
    s = 2048
    full = flops.recompute_flops_per_token(m, s, full=True)
    assert full == pytest.approx(m.layers * flops.layer_forward_flops_per_token(m, s))
    selective = flops.recompute_flops_per_token(m, s, full=False)
    assert selective == pytest.approx(m.layers * 2 * s * m.hidden)
