"""Selective recompute by module (Megatron-Core's ``recompute_modules``; issue 33): what each
module drops from a layer's activations and adds to its backward, checked by hand against
the activation terms and the GEMM times; plans carry the modules, the rules check them
against the model, and the Megatron-LM and NeMo exports hand them to Megatron-Core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.descriptors.strict import parse_yaml
from autoplan.errors import InputError
from autoplan.kernels import memory
from autoplan.kernels.compute import gemm_time, module_forward
from autoplan.kernels.layer import BF16_BYTES, mlp_gemms
from autoplan.plans.file import read_plan
from autoplan.vocab import Recompute
from autoplan.vocab import RecomputeModule as M
from tests.helpers import autoplan

DSV3 = """\
autoplan: 1
model: deepseek-v3
cluster: {name: dgx-h100, nodes: 64}
job: {global_batch: 1024, seq_len: 4096, dtype: bf16}
layout: {dp: 32, tp: 1, pp: 16, cp: 1, ep: 32, vpp: 1}
micro_batch: 1
schedule: 1f1b
recompute: selective
zero: 1
sequence_parallel: false
stack: megatron-core
"""


def _plan(extra: str = "", text: str = DSV3):
    return read_plan(parse_yaml(text + extra, "p.yaml"), "p.yaml")


def _shard(plan):
    from autoplan.cost.stage import shard_of

    return shard_of(plan)


def test_each_module_drops_what_its_forward_kept_by_hand() -> None:
    """DeepSeek-V3 at s*b = 4096 tokens a rank, tp 1, flash attention: per MoE layer, per
    micro-batch; e = 2 bytes. layernorm: the two norm outputs, 2 e s h; mla_up_proj: the
    up-projected Q, K, V, e s (q + k + v); moe_act: the activation's output over every
    routed copy, e r f; shared_experts: the shared expert's fc1 output and fc2 input,
    e s (2 + 1) f_shared; moe: the whole MoE MLP; core_attn: the softmax statistics."""
    plan = _plan()
    model, shard = plan.model, _shard(plan)
    s, h, e = shard.tokens, model.hidden, BF16_BYTES

    def kept(*mods: M) -> float:
        return memory.layer_activation_bytes(model, shard, Recompute.SELECTIVE, moe=True,
                                             modules=frozenset(mods))

    base = kept(M.CORE_ATTN)
    assert memory.layer_activation_bytes(model, shard, Recompute.SELECTIVE, moe=True) == base  # the default
    assert base - kept(M.CORE_ATTN, M.LAYERNORM) == pytest.approx(2 * e * s * h)
    q, k, v, _ = model.attn_widths
    assert base - kept(M.CORE_ATTN, M.MLA_UP_PROJ) == pytest.approx(e * s * (q + k + v))
    routed = shard.routed_tokens(model)
    assert base - kept(M.CORE_ATTN, M.MOE_ACT) == pytest.approx(e * routed * model.expert_width)
    shared = e * s * 3 * model.shared_experts * model.shared_width
    assert base - kept(M.CORE_ATTN, M.SHARED_EXPERTS) == pytest.approx(shared)
    assert base - kept(M.CORE_ATTN, M.MOE) == pytest.approx(memory.moe_mlp_activation_bytes(model, shard))
    heads = model.heads / shard.tp
    # without core_attn the flash kernel's fp32 log-sum-exp per query and head stays
    assert kept(M.LAYERNORM) - kept(M.CORE_ATTN, M.LAYERNORM) == pytest.approx(4 * heads * s)


def test_a_dense_layers_mlp_recompute_drops_its_internals_and_costs_its_gemms() -> None:
    text = DSV3.replace("deepseek-v3", "llama3-70b").replace("nodes: 64", "nodes: 4").replace(
        "dp: 32, tp: 1, pp: 16, cp: 1, ep: 32", "dp: 4, tp: 8, pp: 1, cp: 1, ep: 1").replace(
        "sequence_parallel: false", "sequence_parallel: true")
    plan = _plan(text=text)
    model, shard = plan.model, _shard(plan)
    s, f, t, e = shard.tokens, model.ffn_hidden, shard.tp, BF16_BYTES
    base = memory.layer_activation_bytes(model, shard, Recompute.SELECTIVE)
    mlp = memory.layer_activation_bytes(model, shard, Recompute.SELECTIVE,
                                        modules=frozenset((M.CORE_ATTN, M.MLP)))
    assert base - mlp == pytest.approx(e * s * 3 * f / t)  # SwiGLU: fc1's 2f output and fc2's f input
    device = plan.cluster.device
    gemms = sum(gemm_time(g.m, g.n, g.k, device, shard.dtype) for g in mlp_gemms(model, s, t, f))
    activation = s * e * 3 * f / t / (device.hbm_Bps * device.hbm_efficiency)
    assert module_forward(model, shard, device, M.MLP, False) == pytest.approx(
        (gemms + activation) / shard.kernel_efficiency)
    assert module_forward(model, shard, device, M.MOE, False) == 0.0  # no MoE layer here


def test_recomputing_modules_trades_memory_for_time_in_the_prediction() -> None:
    from autoplan.cost.evaluate import evaluate

    default = evaluate(_plan())
    light = evaluate(_plan("recompute_modules: [core_attn, moe_act, layernorm, mla_up_proj]\n"))
    heavy = evaluate(_plan("recompute_modules: [moe, mla_up_proj, layernorm]\n"))
    acts = [p.memory.activations for p in (default, light, heavy)]
    assert acts[0] > acts[1] > acts[2]
    assert default.breakdown.recompute < light.breakdown.recompute < heavy.breakdown.recompute
    assert heavy.breakdown.ep_comm > default.breakdown.ep_comm  # the MoE layer dispatches again


@pytest.mark.parametrize(("extra", "field", "says"), [
    ("recompute_modules: [moe]\n", "recompute_modules", "has no MoE layers"),
    ("recompute_modules: [mla_up_proj]\n", "recompute_modules", "no multi-head latent attention"),
    ("recompute_modules: [attention]\n", "recompute_modules[0]", "expected one of core_attn"),
    ("recompute_modules: [mlp, mlp]\n", "recompute_modules[1]", "listed twice"),
    ("recompute_modules: []\n", "recompute_modules", "expected a list"),
])
def test_modules_the_model_lacks_are_refused_naming_the_field(extra: str, field: str, says: str) -> None:
    text = DSV3.replace("deepseek-v3", "llama3-70b").replace("nodes: 64", "nodes: 4").replace(
        "dp: 32, tp: 1, pp: 16, cp: 1, ep: 32", "dp: 4, tp: 8, pp: 1, cp: 1, ep: 1")
    with pytest.raises(InputError) as info:
        _plan(extra, text)
    assert any(p.field == field and says in p.message for p in info.value.problems), info.value.problems


def test_modules_need_selective_recompute() -> None:
    with pytest.raises(InputError, match="recompute is full"):
        _plan("recompute_modules: [moe]\n", DSV3.replace("recompute: selective", "recompute: full"))


def test_a_plan_file_carries_its_modules_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(DSV3 + "recompute_modules: [moe_act, layernorm]\n")
    got = autoplan("evaluate", path, "--format", "json")
    assert got.returncode == 0 or got.returncode == 1, got.stderr
    doc = json.loads(got.stdout)["plans"][0]
    assert doc["recompute_modules"] == ["moe_act", "layernorm"]
    assert _plan("recompute_modules: [moe_act, layernorm]\n").to_dict()["recompute_modules"] == [
        "moe_act", "layernorm"]


@pytest.mark.torch
def test_megatron_core_builds_the_exported_modules(tmp_path: Path) -> None:
    from autoplan.export import Target, export
    from tests.unit.test_export import flags, megatron_config, run_script, torchrun_args

    plan = _plan("recompute_modules: [moe_act, layernorm, mla_up_proj]\n")
    files = export(plan, Target.MEGATRON, "p.yaml")
    (words,) = run_script(tmp_path, files, "pretrain_megatron.sh")[0]
    cfg = megatron_config(flags(torchrun_args(words).training_script_args))
    assert cfg.recompute_granularity == "selective"
    assert cfg.recompute_modules == ["moe_act", "layernorm", "mla_up_proj"]


@pytest.mark.torch
def test_nemo_overrides_name_the_modules_for_megatron_core() -> None:
    import yaml

    from autoplan.export import Target, export

    plan = _plan("recompute_modules: [moe_act, layernorm]\n")
    doc = yaml.safe_load(export(plan, Target.NEMO, "p.yaml")["nemo_overrides.yaml"])
    assert doc["model"]["recompute_granularity"] == "selective"
    assert doc["model"]["recompute_modules"] == ["moe_act", "layernorm"]


def test_launchers_without_modules_refuse_them_by_name(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(DSV3 + "recompute_modules: [moe_act]\n")
    got = autoplan("export", path, "--to", "deepspeed")
    assert got.returncode == 2 and "recompute_modules: cannot export to deepspeed" in got.stderr


def test_hardware_flops_count_the_recomputed_modules_by_hand() -> None:
    """core_attn alone is selective recompute's attention core (Korthikanti et al. Sec. 4.2);
    mlp adds 2 FLOPs per dense-MLP weight per token: Llama 3 70B, 80 layers of three
    8,192 x 28,672 matrices, 2 x 3 x 8192 x 28672 x 80 per token."""
    from autoplan.descriptors.library import resolve_model
    from autoplan.kernels import flops

    llama = resolve_model("llama3-70b")
    core = flops.module_recompute_flops_per_token(llama, 4096, frozenset((M.CORE_ATTN,)))
    assert core == flops.recompute_flops_per_token(llama, 4096, full=False)
    with_mlp = flops.module_recompute_flops_per_token(llama, 4096, frozenset((M.CORE_ATTN, M.MLP)))
    assert with_mlp - core == 2 * 3 * 8192 * 28672 * 80


def test_diff_and_the_plan_line_name_the_modules(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(DSV3)
    b.write_text(DSV3 + "recompute_modules: [moe, layernorm]\n")
    got = autoplan("diff", a, b, "--format", "json")
    assert got.returncode in (0, 1), got.stderr
    assert "selective (moe, layernorm)" in got.stdout
