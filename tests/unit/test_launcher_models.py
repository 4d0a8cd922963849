"""What each launcher runs is autoplan's model of it, checked against the launcher's code
(the citations in searchspace/*.yaml): torchtitan's FSDP2 is ZeRO-3 without a pipeline and
ZeRO-1 under one, and it shards over the context-parallel ranks whatever the replicas."""

from __future__ import annotations

import dataclasses

import tomllib

from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import load_space
from autoplan.export import Target, export, refusals
from autoplan.parallel.rules import space_problems
from autoplan.search.engine import search
from autoplan.vocab import CpComm, ZeroStage
from tests.helpers import make_plan

TITAN = load_space("torchtitan")


def test_torchtitan_runs_fsdp_under_a_pipeline_as_zero_1_not_zero_3() -> None:
    zero3 = make_plan("llama3-8b", gpus=16, dp=4, pp=4, zero=ZeroStage.PARAMETERS)
    zero1 = make_plan("llama3-8b", gpus=16, dp=4, pp=4, zero=ZeroStage.OPTIMIZER)
    assert [f for f, _ in space_problems(zero3, TITAN)] == ["zero"]
    assert space_problems(zero1, TITAN) == []
    par = tomllib.loads(export(zero1, Target.TORCHTITAN)["torchtitan.toml"])["parallelism"]
    # FSDP2 over the data-parallel ranks, the policy that keeps parameters whole under pp
    assert par["data_parallel_shard_degree"] == 4 and par["data_parallel_replicate_degree"] == 1
    assert par["fsdp_reshard_after_forward"] == "default"
    # without a pipeline torchtitan's FSDP2 is ZeRO-3, and there is no ZeRO-1 of its own
    flat3 = make_plan("llama3-8b", gpus=16, dp=16, zero=ZeroStage.PARAMETERS)
    flat1 = make_plan("llama3-8b", gpus=16, dp=16, zero=ZeroStage.OPTIMIZER)
    assert space_problems(flat3, TITAN) == []
    assert [f for f, _ in space_problems(flat1, TITAN)] == ["zero"]


def test_torchtitan_refuses_plain_data_parallel_beside_context_parallel() -> None:
    plan = make_plan("llama3-8b", gpus=16, dp=8, cp=2, seq_len=8192, zero=ZeroStage.NONE)
    assert refusals(plan, Target.TORCHTITAN)
    assert any("context" in msg for _, msg in space_problems(plan, TITAN))


def test_a_torchtitan_search_never_ranks_zero_3_with_a_pipeline() -> None:
    model, cluster = resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-h100"), 32)
    result = search(model, cluster, Job(global_batch=32, seq_len=4096), TITAN, top_k=20)
    assert result.plans
    for r in result.plans:
        lay = r.plan.layout
        assert not (lay.pp > 1 and r.plan.zero is ZeroStage.PARAMETERS)
        assert not (r.plan.zero is ZeroStage.NONE and lay.dp > 1 and lay.tp * lay.pp * lay.cp > 1)
        assert not refusals(r.plan, Target.TORCHTITAN)


def test_megatron_runs_all_to_all_context_parallelism_only_where_cp_divides_the_kv_heads() -> None:
    megatron = load_space("megatron")
    # Llama 3 70B: 8 key-value heads, 1 per rank at tp8; TE's a2a asserts kv % cp == 0
    few = make_plan("llama3-70b", gpus=64, dp=4, tp=8, cp=2, seq_len=8192,
                    zero=ZeroStage.OPTIMIZER, sequence_parallel=True)
    few = few.replace(cp_comm=CpComm.A2A)
    assert [f for f, _ in space_problems(few, megatron)] == ["cp_comm"]
    assert refusals(few, Target.MEGATRON) and refusals(few, Target.NEMO)
    assert space_problems(few, load_space("any")) == []  # replicating kv heads, launcher-free
    enough = make_plan("llama3-70b", gpus=64, dp=4, tp=4, cp=2, pp=2, seq_len=8192,
                       zero=ZeroStage.OPTIMIZER, sequence_parallel=True).replace(cp_comm=CpComm.A2A)
    assert space_problems(enough, megatron) == []


def test_fp8_with_moe_act_or_layernorm_recompute_exports_current_scaling() -> None:
    from autoplan.vocab import Dtype, Recompute, RecomputeModule

    plan = make_plan("llama3-8b", gpus=8, dp=8, zero=ZeroStage.OPTIMIZER, dtype=Dtype.FP8,
                     recompute=Recompute.SELECTIVE)
    plain = export(plan, Target.MEGATRON)["pretrain_megatron.sh"]
    assert "--fp8-format hybrid" in plain and "--fp8-recipe" not in plain  # delayed, the default
    modules = plan.replace(recompute_modules=(RecomputeModule("core_attn"), RecomputeModule("layernorm")))
    script = export(modules, Target.MEGATRON)["pretrain_megatron.sh"]
    assert "--fp8-recipe tensorwise" in script  # delayed scaling refuses layernorm recompute
    overrides = export(modules, Target.NEMO)["nemo_overrides.yaml"]
    assert "bf16_with_fp8_current_scaling_mixed" in overrides


def test_ep_overlap_is_refused_beside_the_moe_recompute_module() -> None:
    """Megatron-Core >= 0.17 asserts it (TransformerConfig.__post_init__); the search, whose
    module sets hold [moe, layernorm, mla_up_proj], never pairs them."""
    from autoplan.parallel.rules import plan_problems
    from autoplan.vocab import Recompute, RecomputeModule

    model = dataclasses.replace(resolve_model("deepseek-v3"), layers=6, dense_layers=1)
    plan = make_plan(model, gpus=32, dp=8, pp=2, vpp=2, ep=8, zero=ZeroStage.OPTIMIZER,
                     global_batch=256, recompute=Recompute.SELECTIVE)
    moe = plan.replace(recompute_modules=(RecomputeModule.MOE, RecomputeModule.LAYERNORM),
                       ep_overlap=True)
    assert any("moe recompute module" in str(p) for p in plan_problems(moe))
    act = moe.replace(recompute_modules=(RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM))
    assert not any("recompute module" in str(p) for p in plan_problems(act))
