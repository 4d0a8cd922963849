"""DeepSeek-V4 (issue 51): its config read into sliding, compressed sparse and heavily
compressed layers with hyper-connections; its parameter count against the model card, each
part against a hand count of its inference code's tensors; training FLOPs and memory per
kind, serving memory per sequence by hand; search, serve and the launchers' refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoplan.descriptors.hf import model_from_hf_config
from autoplan.descriptors.library import resolve_cluster, with_gpus
from autoplan.descriptors.model import CSA, HCA, SLIDING, Model
from autoplan.errors import InputError
from autoplan.kernels import mixers
from autoplan.kernels.layer import Gemm
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Deployment
from autoplan.serving.engine import Engine
from tests.helpers import autoplan

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
FLASH = "deepseek-ai--DeepSeek-V4-Flash"
PRO = "deepseek-ai--DeepSeek-V4-Pro"


def _config(stem: str) -> dict[str, Any]:
    return json.loads((DATA / f"{stem}.config.json").read_text(encoding="utf-8"))


def _import(stem: str = FLASH, data: dict[str, Any] | None = None) -> Model:
    return model_from_hf_config(data if data is not None else _config(stem), f"{stem}.config.json")


def _problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InputError) as caught:
        model_from_hf_config(data, "config.json")
    return {p.field: p.message for p in caught.value.problems}


# -- import and parameter counts ---------------------------------------------------------------


def test_flash_reads_compress_ratios_into_two_window_21_csa_and_20_hca_layers() -> None:
    m = _import()
    assert m.mixers == "WW" + "CH" * 20 + "C"
    assert m.kinds == {(SLIDING, "E"): 2, (CSA, "E"): 21, (HCA, "E"): 20}
    assert (m.csa_ratio, m.hca_ratio, m.sliding_window) == (4, 128, 128)
    assert (m.hc_mult, m.hc_sinkhorn_iters, m.mtp_layers, m.kv_heads) == (4, 20, 1, 1)
    assert (m.o_groups, m.o_lora_rank, m.q_lora_rank, m.kv_channels) == (8, 1024, 1024, 512)
    assert m.mtp_kind == (SLIDING, "E")  # its MTP layer compresses nothing (compress_ratios[43] = 0)


def test_flash_count_is_within_half_a_percent_of_the_cards_284b() -> None:
    # model card (huggingface.co/deepseek-ai/DeepSeek-V4-Flash): 284B total, 13B activated
    m = _import()
    assert m.params_total == pytest.approx(284e9, rel=0.005)
    assert m.params_total == 284_332_241_239


def test_pro_count_rounds_to_the_cards_1_6t() -> None:
    # model card: 1.6T total, 49B activated (two significant digits)
    m = _import(PRO)
    assert 1.55e12 <= m.params_total < 1.65e12
    assert m.mixers.count(CSA) == 30 and m.mixers.count(HCA) == 31


def test_each_part_is_its_inference_codes_tensors_counted_by_hand() -> None:
    m = _import()
    h, n, d, q, g, r = 4096, 64, 512, 1024, 8, 1024
    # wq_a, q_norm, wq_b, wkv, kv_norm, wo_a (per group n d / g -> r), wo_b, attn_sink
    attention = h * q + q + q * n * d + h * d + d + g * (n * d // g) * r + g * r * h + n
    assert m.params_v4_attention == attention
    # a ratio-4 compressor (overlapping: 2 d wide): ape 4 x 2d, wkv and wgate, norm
    assert m.params_compressor(4, d) == 4 * 2 * d + 2 * h * 2 * d + d
    assert m.params_compressor(128, d) == 128 * d + 2 * h * d + d
    # the indexer: wq_b from the q latent, weights_proj, its own 128-wide compressor
    assert m.params_indexer == q * 64 * 128 + h * 64 + (4 * 256 + 2 * h * 256 + 128)
    # hc_fn (24 x 4h), hc_base (24), hc_scale (3) per block
    assert m.params_hyper_connections == 24 * 4 * h + 24 + 3
    experts = 256 * 3 * h * 2048 + 3 * h * 2048 + 256 * h + 256  # routed, shared, router + bias
    blocks = 2 * (h + m.params_hyper_connections)  # a norm and the maps before each block
    assert m.params_kind((HCA, "E")) == attention + m.params_compressor(128, d) + experts + blocks
    # embedding, final norm, output head and the head's fold of the 4 streams
    assert m.params_embedding + m.params_output == 2 * 129280 * h + h + 4 * 4 * h + 4 + 1


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"compress_ratios": [0, 4]}, "compress_ratios", "one entry per layer"),
    ({"compress_ratios": [0] * 43 + [4]}, "compress_ratios[43]", "MTP module"),
    ({"compress_ratios": [0, 4, 128, 64] + [4] * 39 + [0]}, "compress_ratios", "one heavily compressed"),
    ({"compress_ratios": "4,128"}, "compress_ratios", "list of integers"),
    ({"num_key_value_heads": 8}, "num_key_value_heads", "one key-value head"),
    ({"o_groups": 7}, "o_groups", "divisor of heads"),
    ({"hc_mult": 0}, "hc_mult", ""),
    ({"num_hash_layers": 99}, "num_hash_layers", "at most num_hidden_layers"),
    ({"first_k_dense_replace": 3}, "first_k_dense_replace", "dense layers"),
])
def test_a_bad_v4_config_is_refused_naming_its_key(change, field, words) -> None:
    problems = _problems({**_config(FLASH), **change})
    assert field in problems and words in problems[field], problems


def test_a_model_file_with_compressed_layers_but_no_v4_attention_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: x\n  layers: 2\n  hidden: 1024\n  heads: 8\n"
                    "  ffn_hidden: 4096\n  vocab: 1000\n  activation: swiglu\n"
                    "  position: rope\n  tied_embeddings: false\n  max_seq_len: 4096\n"
                    "  mixers: CH\n  sliding_window: 128\n  csa_ratio: 4\n  hca_ratio: 128\n"
                    "  index_heads: 4\n  index_head_dim: 64\n  index_topk: 64\n", encoding="utf-8")
    result = autoplan("search", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8",
                      "--global-batch", "8", "--seq-len", "1024")
    assert result.returncode == 2 and "o_lora_rank" in result.stderr and "Traceback" not in result.stderr


# -- training ------------------------------------------------------------------------------------


def test_compressed_cores_attend_to_the_window_and_the_pooled_keys_by_hand() -> None:
    m, s = _import(), 8192
    per_key = 2 * 64 * (512 + 512)  # QK^T and AV over one 512-wide key-value head, 64 heads
    window = 128 - 128 ** 2 / (2 * s)  # past the first 128 queries each sees 128 keys
    assert mixers.core_flops_per_token(m, SLIDING, s) == pytest.approx(per_key * window)
    # H: every key pooled from 128 tokens: a query at t sees t / 128 of them, s / 256 on average
    assert mixers.core_flops_per_token(m, HCA, s) == pytest.approx(per_key * (window + s / 256))
    # C: the indexer scores the s / 8 pooled keys a query sees on average with 64 heads of 128;
    # attention over at most 512 of the 2048 pooled: 512 - 512^2 / (2 x 2048) = 448 on average
    index = 2 * (s / 8) * 64 * 128
    assert mixers.core_flops_per_token(m, CSA, s) == pytest.approx(index + per_key * (window + 448))


def test_each_block_runs_its_hyper_connection_map_and_a_pipeline_send_carries_four_streams() -> None:
    m = _import()
    gemms = mixers.kind_gemms(m, (HCA, "E"), 1000.0, 1)
    assert gemms.count(Gemm(1000.0, 24, 4 * 4096, quantized=False)) == 2
    assert Gemm(1000.0, 2 * 512, 4096, quantized=False) in gemms  # the HCA compressor, fp32
    assert m.residual_streams == 4


def test_a_flash_plan_fits_and_its_pipeline_sends_carry_four_streams_and_megatron_refuses_it() -> None:
    from autoplan.cost.evaluate import evaluate
    from autoplan.cost.stage import activation_bytes
    from autoplan.vocab import Recompute
    from tests.helpers import make_plan

    plan = make_plan("deepseek-v4-flash", cluster="dgx-h200", gpus=64, dp=8, pp=8, ep=8,
                     global_batch=256, recompute=Recompute.FULL)
    result = evaluate(plan)
    assert result.feasible and 0.05 < result.mfu < 0.7
    # one microbatch of 4096 tokens, four copies of the 4096-wide hidden state, in 16 bits
    assert activation_bytes(plan) == 4 * 2 * 4096 * 4096
    refused = autoplan("search", "--model", "deepseek-v4-flash", "--cluster", "dgx-h200", "--gpus", "64",
                       "--global-batch", "256", "--seq-len", "4096", "--launcher", "megatron")
    assert refused.returncode == 2 and "DeepSeek-V4 attention" in refused.stderr


# -- serving -------------------------------------------------------------------------------------


def test_a_sequence_holds_the_windows_the_pooled_keys_and_the_compressors_buffers_by_hand() -> None:
    m = _import()
    step = StepModel(m, with_gpus(resolve_cluster("dgx-h200"), 8), Deployment(replicas=1, tp=8),
                     Engine.VLLM, None)
    e = 2  # a bf16 cache
    cache = step.cache  # the fullest stage: pp 1, every layer, on each GPU of the TP group
    # beyond the window: a C layer one 512-wide key and its indexer's FP4 128-wide key per 4
    # tokens, an H layer one key per 128 tokens (one key-value head: whole on every GPU)
    assert cache.kv_per_token == pytest.approx(21 * (512 * e + 64) / 4 + 20 * 512 * e / 128)
    # every layer's last 128 tokens raw (2 W, 21 C, 20 H)
    assert cache.sliding_per_token == 43 * 512 * e and cache.window == 128
    # fp32 kv and score buffers of the tokens not yet pooled: C 2 x 4 x 2 x 512 and its
    # indexer's 2 x 4 x 2 x 128; H 2 x 128 x 512
    state = 21 * (2 * 4 * 2 * 512 * 4 + 2 * 4 * 2 * 128 * 4) + 20 * (2 * 128 * 512 * 4)
    assert cache.state_per_sequence == state
    context = 100_000
    assert cache.per_sequence(context) == pytest.approx(
        state + 43 * 512 * e * 128 + context * cache.kv_per_token)


def test_decode_reads_the_window_and_a_share_of_the_pooled_keys() -> None:
    m = _import()
    step = StepModel(m, with_gpus(resolve_cluster("dgx-h200"), 8), Deployment(replicas=1, tp=8),
                     Engine.VLLM, None)
    n, context = 4, 4 * 400_000  # every window full, every C layer past its 512 picks
    const, slope = step._decode_kinds(n, context)
    per = step._ctx_s[HCA]
    assert step._ctx_s[CSA] == per
    window = 43 * per * n * 128
    picked = 21 * per * n * 512
    assert const == pytest.approx(window + picked)
    assert slope == pytest.approx(20 * per / 128 + 21 * step._index_ctx_s / 4)


# serve on Flash end to end: tests/unit/test_mixer_tables.py (its compressed layers measured)
