"""Memory terms against Korthikanti et al. 2022 (Sec. 4, eqs. 2 and 4) and Megatron-LM's
distributed-optimizer table, worked by hand; exact (the formulas are closed forms)."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.library import resolve_model
from autoplan.kernels.layer import Shard
from autoplan.kernels.memory import layer_activation_bytes, sharded_state_bytes
from autoplan.schedules import Schedule
from autoplan.vocab import Dtype, Recompute, ZeroStage
from tests.helpers import make_plan

GPT3 = resolve_model("gpt3-175b")  # GPT: gelu, 4h MLP, dropout, MHA: the paper's setting
S, B, H, A = 2048, 1, 12288, 96


def shard(tp: int, sp: bool) -> Shard:
    return Shard(micro_batch=B, seq_len=S, tp=tp, cp=1, sequence_parallel=sp, dtype=Dtype.BF16)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activations_without_sp_match_korthikanti_eq2(t):
    expected = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    got = layer_activation_bytes(GPT3, shard(t, False), Recompute.NONE, flash=False)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_activations_with_sp_match_korthikanti_eq4(t):
    expected = S * B * H / t * (34 + 5 * A * S / H)
    got = layer_activation_bytes(GPT3, shard(t, True), Recompute.NONE, flash=False)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_torch_native_sp_keeps_the_two_gathered_gemm_inputs_whole(t):
    """DTensor SP (torchtitan) saves the all-gathered QKV and MLP-up inputs: Korthikanti's
    eq. 4 with those two 2sbh/t terms whole (2sbh each), 30sbh/t + 4sbh in all."""
    gathered = dataclasses.replace(shard(t, True), sp_saves_gathered=True)
    expected = S * B * H * (30 / t + 4 + 5 * A * S / (H * t))
    got = layer_activation_bytes(GPT3, gathered, Recompute.NONE, flash=False)
    assert got == pytest.approx(expected, rel=1e-12)
    # without SP nothing is gathered, and full recompute keeps only the (sharded) layer input
    plain = dataclasses.replace(shard(t, False), sp_saves_gathered=True)
    assert layer_activation_bytes(GPT3, plain, Recompute.NONE, flash=False) == \
        layer_activation_bytes(GPT3, shard(t, False), Recompute.NONE, flash=False)
    assert layer_activation_bytes(GPT3, gathered, Recompute.FULL) == 2 * S * B * H / t


def test_selective_recompute_with_sp_keeps_34_sbh_over_t():
    """Korthikanti et al. Sec. 4.2: selective recompute removes the 5as/h term."""
    got = layer_activation_bytes(GPT3, shard(8, True), Recompute.SELECTIVE, flash=False)
    assert got == pytest.approx(34 * S * B * H / 8, rel=1e-12)


def test_full_recompute_keeps_only_the_layer_input():
    assert layer_activation_bytes(GPT3, shard(8, False), Recompute.FULL) == 2 * S * B * H
    assert layer_activation_bytes(GPT3, shard(8, True), Recompute.FULL) == 2 * S * B * H / 8


def test_flash_attention_replaces_the_s_squared_terms_with_softmax_statistics():
    classic = layer_activation_bytes(GPT3, shard(8, True), Recompute.NONE, flash=False)
    flash = layer_activation_bytes(GPT3, shard(8, True), Recompute.NONE, flash=True)
    assert classic - flash == pytest.approx(5 * A * S * S * B / 8 - 4 * A / 8 * S * B)


def test_gqa_and_swiglu_change_exactly_the_k_v_and_mlp_terms():
    """llama3-8b (h 4096, 8 KV heads of 128, f 14336, no dropout), t=1, no SP, flash:
    norms 4sbh + GEMM inputs 4sbh + Q,K 2sb(h + 1024) + V 2sb*1024 + proj 2sbh
    + fc1 output 2sb*2f + fc2 input 2sbf + LSE 4*a*sb."""
    m = resolve_model("llama3-8b")
    s, h, kv, f, a = 4096, 4096, 1024, 14336, 32
    sh = Shard(micro_batch=1, seq_len=s, tp=1, cp=1, sequence_parallel=False, dtype=Dtype.BF16)
    expected = s * (4 * h + 4 * h + 2 * (h + kv) + 2 * kv + 2 * h + 4 * f + 2 * f + 4 * a)
    assert layer_activation_bytes(m, sh, Recompute.NONE) == expected


@pytest.mark.parametrize("d", [1, 8, 64])
def test_bf16_states_follow_megatrons_distributed_optimizer_table(d):
    """docs/distrib_optimizer.md: bf16 params + fp32 grads: 18 B/param; distributed 6 + 12/d."""
    plain = sharded_state_bytes(1.0, Dtype.BF16, ZeroStage.NONE, d)
    assert plain.weights + plain.grads + plain.optimizer == 18
    dist = sharded_state_bytes(1.0, Dtype.BF16, ZeroStage.OPTIMIZER, d)
    assert dist.weights + dist.grads + dist.optimizer == pytest.approx(6 + 12 / d)


def test_fp16_states_follow_the_table_and_zero_stages_shard_progressively():
    """fp16: 20 B/param, distributed 4 + 16/d; ZeRO-2 also shards grads, ZeRO-3 weights."""
    d = 16
    total = [sum((s.weights, s.grads, s.optimizer))
             for s in (sharded_state_bytes(1.0, Dtype.FP16, z, d) for z in ZeroStage)]
    assert total == pytest.approx([20, 4 + 16 / d, 2 + 18 / d, 20 / d])


def test_1f1b_first_stage_holds_p_microbatches_and_gpipe_holds_all():
    common = dict(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=32, recompute=Recompute.NONE)
    one = evaluate(make_plan(schedule=Schedule.ONE_F_ONE_B, **common))
    gpipe = evaluate(make_plan(schedule=Schedule.GPIPE, **common))
    m = 16
    layer_act = one.memory_per_stage[1].activations / 3  # stage 1 holds p - 1 = 3 microbatches
    assert gpipe.memory_per_stage[1].activations == pytest.approx(m * layer_act)
    # middle stages differ only by their in-flight counts (4-1=3 and 4-2=2 microbatches)
    assert one.memory_per_stage[2].activations == pytest.approx(2 * layer_act)


def test_last_stage_holds_the_fp32_logits():
    plan = make_plan(model="llama3-8b", gpus=8, dp=4, pp=2, global_batch=32)
    pred = evaluate(plan)
    logits = 4 * 4096 * 128256  # b*s*V*4 bytes, t=1
    # stage 1 holds one microbatch of 16 layers' activations + logits; stage 0 two + embedding
    per_layer = layer_activation_bytes(plan.model, Shard(1, 4096, 1, 1, False, Dtype.BF16),
                                       Recompute.NONE)
    assert pred.memory_per_stage[1].activations == pytest.approx(16 * per_layer + logits)
