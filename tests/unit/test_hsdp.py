"""Hybrid sharded data parallelism (``layout.dp_shard``: ZeRO over dp_shard x cp ranks,
replicated over dp / dp_shard): memory against FSDP's and ZeRO's per-rank formula over the
shard group, communication against FSDP2 HSDP's and ZeRO++'s (reduce-scatter within the
shard, all-reduce of the shard across replicas, gathers within the shard), the plan file
and rules, the exports, and the search against brute force with the new dimension."""

from __future__ import annotations

import dataclasses

import pytest
import tomllib
import yaml

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import default_stack, resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import load_space
from autoplan.export import Target, export, refusals
from autoplan.kernels import comm, memory
from autoplan.parallel import dp, mesh
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Layout
from autoplan.plans.file import plan_document, read_plan
from autoplan.search.engine import search
from autoplan.vocab import Axis, Dtype, ZeroStage
from tests.helpers import make_plan
from tests.unit.test_search import brute_force


def hsdp(zero=ZeroStage.PARAMETERS, shard=8, **kw):
    """Llama 3 8B on 64 H100 (8 nodes), dp 64 sharded within each node's 8 ranks."""
    plan = make_plan("llama3-8b", gpus=64, dp=64, global_batch=128, zero=zero, **kw)
    return dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, dp_shard=shard))


def test_states_shard_over_the_shard_group_as_fsdp_counts_them():
    # ZeRO-3 / FSDP: (2 + 4 + 12) bytes a parameter (bf16 weights, fp32 grads, fp32 master and
    # Adam moments) over the ranks sharding them: dp_shard x cp, not dp x cp
    full, hybrid = hsdp(shard=64), hsdp(shard=8)
    assert full.layout.dp_shard == 64 and full.layout.dp_replicas == 1
    assert hybrid.layout.dp_replicas == 8
    w = stage_work(hybrid)[0]
    states = dp.state_bytes(hybrid, w.params, w.expert_params)
    expect = memory.sharded_state_bytes(w.params, Dtype.BF16, ZeroStage.PARAMETERS, 8)
    assert (states.weights, states.grads, states.optimizer) == pytest.approx(
        (expect.weights, expect.grads, expect.optimizer))
    assert states.weights + states.grads + states.optimizer == pytest.approx(18 * w.params / 8)
    assert evaluate(hybrid).memory.peak > evaluate(full).memory.peak


def test_gathers_stay_in_the_node_and_the_shard_is_all_reduced_across_replicas():
    plan = hsdp()
    groups = mesh.groups(plan)
    shard, replicas = groups[Axis.DP], groups[Axis.DPR]
    assert (shard.size, replicas.size) == (8, 8)
    assert shard.per_domain == 8 and replicas.per_domain == 1  # NVLink inside, network across
    w = stage_work(plan)[0]
    grads = w.params * 4  # fp32 gradients
    # ZeRO-1/2 sync (ZeRO++ / HSDP): reduce-scatter in the shard, all-reduce of 1/8 across nodes
    one = dataclasses.replace(plan, zero=ZeroStage.OPTIMIZER)
    reduce_s, gather_s = dp._sync_seconds(ZeroStage.OPTIMIZER, Dtype.BF16, w.params, 0.0, shard,
                                          groups[Axis.EDP], replicas=replicas)
    assert reduce_s == pytest.approx(comm.reduce_scatter(grads, shard) + comm.all_reduce(grads / 8, replicas))
    assert gather_s == pytest.approx(comm.all_gather(w.params * 2, shard))
    assert not plan_problems(one)
    # against sharding over all 64 ranks, the in-node gather is faster
    full = mesh.groups(hsdp(shard=64))[Axis.DP]
    assert comm.all_gather(w.params * 2, shard) < comm.all_gather(w.params * 2, full)


def test_the_plan_file_carries_dp_shard_and_the_rules_hold_it():
    plan = hsdp()
    doc = plan_document(plan)
    assert doc["layout"]["dp_shard"] == 8
    assert read_plan(doc, "p", correct=False) == plan  # analytic: the door adds measured grids
    assert "dp_shard" not in plan_document(hsdp(shard=64))["layout"]
    bad = dataclasses.replace(plan, layout=Layout(dp=64, tp=1, pp=1, dp_shard=6))
    assert [f for f, _ in plan_problems(bad)] == ["layout.dp_shard"]
    zero0 = hsdp(zero=ZeroStage.NONE)
    assert [f for f, _ in plan_problems(zero0)] == ["layout.dp_shard"]


@pytest.mark.torch
def test_torchtitan_replicates_and_shards_megatron_counts_instances_deepspeed_refuses():
    files = export(hsdp(), Target.TORCHTITAN)
    par = tomllib.loads(files["torchtitan.toml"])["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (8, 8)
    one = hsdp(zero=ZeroStage.OPTIMIZER)
    script = export(one, Target.MEGATRON)["pretrain_megatron.sh"]
    assert "--num-distributed-optimizer-instances 8" in script
    assert [f for f, _ in refusals(one, Target.DEEPSPEED) if f == "layout.dp_shard"]
    # NeMo 2 / Megatron-Bridge: the same Megatron-Core DDP config field
    assert not refusals(one, Target.NEMO)
    overrides = yaml.safe_load(export(one, Target.NEMO)["nemo_overrides.yaml"])
    assert overrides["ddp"]["num_distributed_optimizer_instances"] == 8


def test_the_search_with_hybrid_sharding_equals_brute_force():
    # 16 GPUs on 2 nodes: dp 16 may shard over a node's 8 (or its dp ranks at tp 2: 4)
    # the brute force builds plans on the default stack: the space on it too
    space = dataclasses.replace(load_space("fsdp"), micro_batches=(1, 2), stack=default_stack())
    assert space.hybrid_shard
    model = resolve_model("llama3-8b")
    cluster = with_gpus(resolve_cluster("dgx-h100"), 16)
    job = Job(global_batch=32, seq_len=4096)
    expected = brute_force(model, cluster, job, space)
    assert any(p.layout.dp_shard < p.layout.dp for _, p, _ in expected)
    result = search(model, cluster, job, space, top_k=6)
    assert [r.plan for r in result.plans] == [p for _, p, _ in expected[:6]]
