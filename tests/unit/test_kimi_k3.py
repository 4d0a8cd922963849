"""Kimi-K3 (issue 51): its config read into Kimi Delta Attention and gated MLA layers with
attention residuals and experts in a latent space; its parameter count against the published
one, each part against a hand count of its tensors (SGLang's models/kimi_k3.py and
kimi_k3_vl.py, the checkpoint's modeling_kimi_linear.py); what the latent experts and the
attention residuals cost; the engines' and Megatron-LM's refusals by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoplan.descriptors.hf import model_from_hf_config
from autoplan.descriptors.model import FULL, KDA, Model
from autoplan.errors import InputError
from autoplan.export.megatron import model_problems
from autoplan.kernels import mixers
from autoplan.kernels.layer import Gemm
from autoplan.serving.engine import Engine
from autoplan.vocab import Activation
from tests.helpers import autoplan

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
STEM = "moonshotai--Kimi-K3"
H = 7168


def _config() -> dict[str, Any]:
    return json.loads((DATA / f"{STEM}.config.json").read_text(encoding="utf-8"))


def _k3(data: dict[str, Any] | None = None) -> Model:
    return model_from_hf_config(data if data is not None else _config(), f"{STEM}.config.json")


def _problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InputError) as caught:
        model_from_hf_config(data, "config.json")
    return {p.field: p.message for p in caught.value.problems}


def test_k3_reads_69_kda_and_24_gated_mla_layers_latent_experts_and_attention_residuals() -> None:
    m = _k3()
    assert m.kinds == {(KDA, "-"): 1, (KDA, "E"): 68, (FULL, "E"): 24}
    assert m.mixers[3] == FULL and m.mixers[92] == FULL  # full_attn_layers 4 and 93, 1-based
    assert (m.kda_full_gate, m.attn_output_gate, m.activation) == (True, True, Activation.SITU)
    assert (m.moe_latent, m.moe_latent_norm, m.attn_res_block) == (3584, True, 12)
    assert (m.experts, m.top_k, m.shared_experts, m.max_seq_len) == (896, 16, 2, 1048576)
    assert m.vision is not None and m.vision.attention_width == 1536


def test_k3_count_is_the_published_2779_93b() -> None:
    # xorbitsai/inference PR 5417: "model_size_in_billions": "2779_93"; the card: 2.8T, 104B
    # activated. KDA's A_log is counted as the 96 values used (the checkpoint stores 128)
    m = _k3()
    assert m.params_total == 2_779_931_834_976
    assert round(m.params_total / 1e9, 2) == 2779.93
    text_active = m.params_active - m.vocab * H - m.vision.params  # without the embedding table
    assert text_active == pytest.approx(104e9, rel=0.005)


def test_each_part_is_its_tensors_counted_by_hand() -> None:
    m = _k3()
    p, d = 96 * 128, 128
    # q, k, v, g (full rank) projections; three depthwise convs of 4; f_a/f_b; b_proj;
    # A_log (96 used), dt_bias, o_norm, o_proj
    assert m.params_kda == 4 * H * p + 3 * p * 4 + (d * H + p * d) + 96 * H + 96 + p + d + H * p
    # MLA: q_a, its norm, q_b; kv_a with the 64 RoPE dims, its norm, kv_b; o_proj; g_proj
    mla = (H * 1536 + 1536 + 1536 * 96 * 192 + H * 576 + 512 + 512 * 96 * 256 + 96 * 128 * H
           + 96 * 128 * H)
    assert m.params_mla == mla == 232_196_096
    assert m.params_expert == 3 * 3584 * 3072  # an expert reads and writes the latent
    assert m.params_latent == 2 * H * 3584 + 3584  # down, up and the norm between
    assert m.params_attn_res == 2 * H  # a norm and a 1 x hidden pseudo-query per mix
    # MoonViT-V2: patch conv, 64 x 64 positions, 27 blocks, final norm; the merger and its norm
    v = m.vision
    block = 2 * 1024 + 3 * 1536 * 1024 + 1024 * 1536 + 2 * 1024 * 4096
    assert v.params == (1024 * 3 * 14 * 14 + 64 * 64 * 1024 + 27 * block + 1024
                        + 4096 * 4096 + 4096 * H + H) == 401_214_464 + 46_144_512


def test_attention_residual_mixes_weigh_1002_candidates_and_a_send_carries_nine_rows() -> None:
    m = _k3()
    # before layer i's attention ceil(i/12) + 1 (none at 0), its MLP floor(i/12) + 2, the final 9
    assert m.attn_res_candidates * (2 * 93 + 1) == pytest.approx(1002)
    assert m.pipeline_rows == 9  # the running sum and 8 block snapshots at the deepest boundary


def test_latent_experts_run_and_dispatch_in_the_latent_width() -> None:
    m = _k3()
    gemms = mixers.kind_gemms(m, (FULL, "E"), 100.0, 1)
    assert Gemm(100.0, 3584, H) in gemms and Gemm(100.0, H, 3584) in gemms
    assert m.expert_hidden == 3584
    assert mixers.kind_params_per_rank(m, 8, (FULL, "E")) == pytest.approx(
        m.params_mla / 8 + (H * 1536 + 1536 + H * 576 + 512) * 7 / 8  # MLA's downs whole
        + m.params_shared_experts / 8 + m.params_router + m.params_latent
        + 2 * (H + m.params_attn_res))


@pytest.mark.parametrize(("change", "field"), [
    ({"latent_moe_use_norm": True, "routed_expert_hidden_size": None}, "text_config.latent_moe_use_norm"),
    ({"attn_res_block_size": -1}, "text_config.attn_res_block_size"),
    ({"hidden_act": "tanh"}, "text_config.hidden_act"),
])
def test_a_bad_k3_text_key_is_refused_naming_it(change, field) -> None:
    data = _config()
    text = {k: v for k, v in {**data["text_config"], **change}.items() if v is not None}
    problems = _problems({**data, "text_config": text})
    assert field in problems, problems


def test_a_vision_width_that_splits_no_heads_evenly_is_refused_naming_it() -> None:
    data = _config()
    problems = _problems({**data, "vision_config": {**data["vision_config"], "qkv_hidden_size": 1000}})
    assert "vision_config.qkv_hidden_size" in problems


def test_the_engines_say_which_release_runs_attention_residuals() -> None:
    m = _k3()
    assert Engine.VLLM.spec.model_refusals("0.33.0", m)[0][1].count("main branch")
    assert Engine.VLLM.spec.model_refusals("nightly", m) == []
    assert "0.5.17" in Engine.SGLANG.spec.model_refusals("0.5.14", m)[0][1]
    assert Engine.SGLANG.spec.model_refusals("0.5.17", m) == []


def test_megatron_refuses_k3_by_its_parts() -> None:
    fields = {field for field, _ in model_problems(_k3())}
    assert {"model.activation", "model.attn_res_block", "model.moe_latent_norm", "model.mixers"} <= fields


def test_serve_deploys_k3_on_an_sglang_release_that_runs_it() -> None:
    served = autoplan("serve", "--model", "kimi-k3", "--cluster", "dgx-h200", "--gpus", "32",
                      "--rate", "1", "--input-len", "2048", "--output-len", "256", "--weights", "fp8",
                      "--engine", "sglang", "--top", "1", "--format", "json")
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["plans"], served.stdout


def test_a_k3_sequence_holds_mla_latents_per_token_and_a_constant_kda_state_by_hand() -> None:
    from autoplan.descriptors.library import resolve_cluster, with_gpus
    from autoplan.serving.cost import StepModel
    from autoplan.serving.deployment import Deployment

    step = StepModel(_k3(), with_gpus(resolve_cluster("dgx-h200"), 32),
                     Deployment(replicas=1, tp=8, pp=4), Engine.SGLANG, None)
    # 4 stages of 23 / 23 / 24 / 23 layers (vLLM's split: the remainder before the last); the
    # pool takes the most any stage holds of each
    cache = step.cache
    e = 2
    # MLA: the 512-wide latent and the 64-wide shared key per token, whole on every GPU; the
    # last stage (70..92) holds 7 MLA layers (71, 75, ..., 91 and 92)
    assert cache.kv_per_token == 7 * (512 + 64) * e
    # the first stage (0..22) holds 18 KDA layers (all but 3, 7, 11, 15, 19)
    # KDA: 96 heads of 128 x 128 in fp32, and the three convs' last 3 inputs, split over TP
    per_layer = (96 * 128 * 128 * 4 + 3 * 3 * 96 * 128 * e) / 8
    assert cache.state_per_sequence == pytest.approx(18 * per_layer)
