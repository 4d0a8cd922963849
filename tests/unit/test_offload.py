"""Offload (kernels/offload.py): optimizer states and pipeline activations in host memory.
Each formula against a hand calculation; the search's answer for a job that fits only
with offload; and the plan, cluster and space files that describe it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import offloaded_chunk_bytes, stage_work
from autoplan.descriptors.hardware import HOST_LINK_EFFICIENCY, HOST_MEM_EFFICIENCY
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import builtin_stack, resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import load_space
from autoplan.errors import InputError
from autoplan.kernels import offload
from autoplan.plans.file import read_plan
from autoplan.resources import searchspace_dir
from autoplan.schedules import Schedule
from autoplan.search.engine import candidate_plans, search
from autoplan.units import GiB
from autoplan.vocab import NO_OFFLOAD, Offload, OffloadOverlap, Recompute, ZeroStage
from tests.helpers import autoplan, make_plan

GB = 1e9


def _offloaded(**kw):
    return make_plan("llama3-70b", gpus=8, global_batch=64, seq_len=8192, dp=1, tp=8,
                     sequence_parallel=True, offload=Offload(optimizer=True), **kw)


@pytest.mark.parametrize(("mode", "combine"), [
    (OffloadOverlap.NONE, lambda d, c, u: d + c + u),
    (OffloadOverlap.BACKWARD, lambda d, c, u: max(c + u, d)),
    (OffloadOverlap.PIPELINED, lambda d, c, u: max(d, c, u)),
])
def test_an_offloaded_optimizer_step_is_its_copies_and_cpu_adam_by_hand(mode, combine):
    """DGX H100 (63 GB/s per GPU to the host, 614 GB/s of DRAM per node, 8 GPUs), bf16:
    per parameter of a rank's shard, 4 B of fp32 gradient down, 2 B of bf16 weight up,
    and on the host 28 B of Adam plus those 6 B, for all 8 GPUs' shards at once."""
    plan = _offloaded(stack=None)
    plan = dataclasses.replace(plan, stack=dataclasses.replace(plan.stack, offload_overlap=mode))
    link = 63 * GB * HOST_LINK_EFFICIENCY
    down, up = 4 / link, 2 / link
    cpu = 8 * (28 + 4 + 2) / (614 * GB * HOST_MEM_EFFICIENCY)
    per_param = combine(down, cpu, up)
    assert offload.optimizer_seconds_per_param(plan) == pytest.approx(per_param, rel=1e-12)
    # tp8, one stage, ZeRO-1 over dp 1: the rank steps all its tp shard's parameters
    shard = stage_work(plan)[0].params
    pred = evaluate(plan)
    assert pred.breakdown.offload == pytest.approx(shard * per_param, rel=1e-12)
    assert pred.breakdown.optimizer == 0.0


def test_an_offloaded_optimizer_leaves_the_gpu_and_takes_host_memory():
    """The GPU keeps weights and gradients; the host holds 16 B per parameter of the shard
    (fp32 master weight, two moments, fp32 gradient), 8 GPUs' worth per node."""
    plan = _offloaded()
    kept, moved = evaluate(plan.replace(offload=NO_OFFLOAD)), evaluate(plan)
    shard = stage_work(plan)[0].params
    assert moved.memory.optimizer == 0.0
    assert kept.memory.optimizer == pytest.approx(12 * shard)
    assert (moved.memory.weights, moved.memory.grads) == (kept.memory.weights, kept.memory.grads)
    assert moved.memory.host == pytest.approx(16 * shard)
    assert moved.host_memory_bytes_per_node == pytest.approx(8 * 16 * shard)
    assert kept.host_memory_bytes_per_node == 0.0
    # the same compute, a slower optimizer step (the allocator's pressure, overhead, aside:
    # the plan keeping its states is far past the device's memory)
    assert (moved.step_time_s - moved.breakdown.overhead
            > kept.step_time_s - kept.breakdown.overhead)


def test_a_node_without_the_host_memory_is_infeasible_and_says_so():
    plan = _offloaded()
    small = dataclasses.replace(plan.cluster, host_mem_bytes=64 * GiB)
    pred = evaluate(plan.replace(cluster=small))
    assert not pred.feasible and "host memory" in pred.reason and "64 GiB" in pred.reason


def test_activation_offload_keeps_one_chunk_and_a_share_of_the_rest():
    """PipeOffload: of n microbatch-chunks held, 1 + (n - 1)(1 - a) stay on the GPU."""
    assert offload.kept_chunks(4, 0.0) == 4
    assert offload.kept_chunks(4, 1.0) == 1
    assert offload.kept_chunks(4, 0.5) == 2.5
    assert offload.kept_chunks(1, 1.0) == 1  # nothing held beyond the one at hand
    plan = make_plan("llama3-8b", gpus=8, global_batch=64, dp=2, pp=4, seq_len=4096)
    half = plan.replace(offload=Offload(activations=0.5))
    a, b = evaluate(plan), evaluate(half)
    works = stage_work(plan)
    per_chunk = offloaded_chunk_bytes(plan, 0, works[0])
    # stage 0 of 1F1B over 4 stages holds 4 microbatches: 1.5 of them move to the host
    assert a.memory_per_stage[0].activations - b.memory_per_stage[0].activations == pytest.approx(
        1.5 * per_chunk)
    assert b.memory_per_stage[0].host == pytest.approx(1.5 * per_chunk)
    assert b.memory_per_stage[-1].host == 0.0  # the last stage holds one: nothing to move


def test_an_activation_copy_is_exposed_only_past_the_compute_it_hides_behind():
    plan = make_plan("llama3-8b", gpus=8, global_batch=64, dp=2, pp=4).replace(
        offload=Offload(activations=1.0))
    link = plan.cluster.host_link_Bps * HOST_LINK_EFFICIENCY
    nbytes = 10 * link  # ten seconds of copy each way
    assert offload.activation_copy_exposed(plan, nbytes, 4.0, 7.0) == pytest.approx(6 + 3)
    assert offload.activation_copy_exposed(plan, nbytes, 20.0, 30.0) == 0.0
    # the step pays it on the stage where it is most: every one of its 32 microbatches
    works, m = stage_work(plan), plan.num_microbatches
    by_stage = [m * offload.activation_copy_exposed(plan, offloaded_chunk_bytes(plan, s, w),
                                                    w.forward, w.backward)
                for s, w in enumerate(works[:-1])]  # the last stage holds one: moves none
    assert evaluate(plan).breakdown.offload == pytest.approx(max(by_stage), rel=1e-12)


def test_llama3_70b_fits_one_8xh100_node_only_with_offload():
    """Issue 16's job: 70B on one DGX H100 needs ~150 GiB per GPU in model states alone;
    with the optimizer offloaded it fits, slower than without offload on more GPUs."""
    job = Job(global_batch=64, seq_len=8192)
    model, space = resolve_model("llama3-70b"), load_space("default")
    node = resolve_cluster("dgx-h100")
    found = search(model, node, job, space, top_k=1, min_headroom_bytes=4 * GiB)
    assert found.plans
    best = found.plans[0]
    assert best.plan.offload.optimizer and best.prediction.feasible
    assert best.prediction.breakdown.offload > 0
    assert best.prediction.host_memory_bytes_per_node <= node.host_mem_bytes
    none = search(model, node, job, dataclasses.replace(space, offload=(NO_OFFLOAD,)), top_k=1,
                  min_headroom_bytes=4 * GiB)
    assert not none.plans and none.closest is not None
    # 32 GPUs hold it without offload: per GPU, the offloaded node is slower
    bigger = search(model, with_gpus(node, 32), job, dataclasses.replace(space, offload=(NO_OFFLOAD,)),
                    top_k=1, min_headroom_bytes=4 * GiB).plans[0]
    per_gpu = best.prediction.tokens_per_s / 8
    assert per_gpu < bigger.prediction.tokens_per_s / 32


def test_search_no_offload_exits_1_with_the_smallest_plans_numbers():
    args = ("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8",
            "--global-batch", "64", "--seq-len", "8192", "--top", "1")
    out = autoplan(*args, "--no-offload")
    assert out.returncode == 1, out.stderr
    assert "needs 150.8 GiB per GPU" in out.stderr
    found = autoplan(*args, "--format", "json")
    assert found.returncode == 0, found.stderr
    doc = json.loads(found.stdout)
    plan = doc["plans"][0]
    assert plan["offload"]["optimizer"] is True
    assert plan["prediction"]["host_memory_gib_per_node"] > 0
    assert plan["prediction"]["breakdown_s"]["offload"] > 0


def test_the_search_tries_only_offload_the_cluster_and_zero_stage_allow():
    """No host in the cluster file: no offload; an offloaded optimizer steps a ZeRO shard;
    activation offload needs a pipeline (the offload rules)."""
    job, model = Job(global_batch=16, seq_len=2048), resolve_model("llama3-70b")
    bare = dataclasses.replace(resolve_cluster("dgx-h100"), host_link_Bps=None,
                               host_mem_bytes=None, host_mem_Bps=None)
    assert not any(p.offload.any for p in candidate_plans(model, bare, job, load_space("megatron")))
    seen = set()
    for p in candidate_plans(model, resolve_cluster("dgx-h100"), job, load_space("default")):
        seen.add((p.offload.optimizer, p.offload.activations > 0))
        assert not (p.offload.optimizer and p.zero is ZeroStage.NONE)
        assert not (p.offload.activations and p.layout.pp == 1)
    # 70B's model states fit 8 GPUs only with the optimizer on the host
    assert seen == {(True, False), (True, True)}


def test_offload_is_tried_only_for_what_does_not_fit_without_it():
    """The search's rule (search/engine.py): a plan offloads only where no uniform-split
    member of its group fits as it is; so each offload candidate's twin without offload
    does not fit, and a job that fits keeps everything on the GPUs."""
    job, model = Job(global_batch=16, seq_len=4096), resolve_model("llama3-8b")
    cluster, space = resolve_cluster("dgx-h100"), load_space("default")
    limit = cluster.device.mem_bytes
    offloads = [p for p in candidate_plans(model, cluster, job, space) if p.offload.any]
    assert {(True, False), (False, True)} <= {
        (t.offload.optimizer, t.offload.activations > 0) for t in offloads}
    assert all(evaluate(t.replace(offload=NO_OFFLOAD)).memory.peak > limit for t in offloads[::7])
    best = search(model, cluster, job, space, top_k=3).plans
    assert best and not any(r.plan.offload.any for r in best)


# --------------------------------------------------------------------------- files

def _plan_doc(**changes):
    doc = {"autoplan": 1, "model": "llama3-8b", "cluster": {"name": "dgx-h100", "nodes": 1},
           "job": {"global_batch": 64, "seq_len": 4096},
           "layout": {"dp": 4, "tp": 1, "pp": 2}, "micro_batch": 1, "zero": 1}
    doc.update(changes)
    return doc


def test_a_plan_file_carries_offload_and_round_trips():
    plan = read_plan(_plan_doc(offload={"optimizer": True, "activations": 0.5}), "p.yaml")
    assert plan.offload == Offload(optimizer=True, activations=0.5)
    again = read_plan(yaml.safe_load(yaml.safe_dump(plan.to_dict())), "q.yaml")
    assert again.offload == plan.offload
    assert "offload" not in read_plan(_plan_doc(), "p.yaml").to_dict()


@pytest.mark.parametrize(("offload", "zero", "field", "says"), [
    ({"activations": 1.5}, 1, "offload.activations", "<= 1.0"),
    ({"optimizer": "yes"}, 1, "offload.optimizer", "true or false"),
    ({"optimizer": True}, 0, "offload.optimizer", "ZeRO stage 1"),
    ({"spill": True}, 1, "offload.spill", "unknown"),
    ({"activations": float("nan")}, 1, "offload.activations", "finite"),
    ([1, 2], 1, "offload", "mapping"),
])
def test_bad_offload_in_a_plan_names_the_field(offload, zero, field, says):
    with pytest.raises(InputError) as err:
        read_plan(_plan_doc(offload=offload, zero=zero), "p.yaml")
    hits = [p for p in err.value.problems if p.field == field]
    assert hits and says.lower() in hits[0].message.lower(), err.value.problems


def test_offload_on_a_cluster_without_a_host_is_refused():
    cluster = resolve_cluster("mi300x-node").to_dict()
    doc = _plan_doc(cluster=cluster, offload={"optimizer": True})
    with pytest.raises(InputError) as err:
        read_plan(doc, "p.yaml")
    assert any(p.field == "offload" and "host_link_GBps" in p.message for p in err.value.problems)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, "fast"])
def test_a_bad_host_link_is_refused_naming_it(value):
    cluster = resolve_cluster("dgx-h100").to_dict()
    cluster["host_link_GBps"] = value
    with pytest.raises(InputError) as err:
        resolve_cluster(cluster, "c.yaml")
    assert [p.field for p in err.value.problems] == ["cluster.host_link_GBps"]


def test_a_cluster_giving_part_of_its_host_names_what_is_missing(tmp_path):
    cluster = resolve_cluster("dgx-h100").to_dict()
    del cluster["host_mem_GBps"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"cluster": cluster}))
    out = autoplan("search", "--model", "llama3-8b", "--cluster", str(path), "--gpus", "8",
                   "--global-batch", "64", "--seq-len", "4096")
    assert out.returncode == 2
    assert "host_mem_GBps" in out.stderr and "c.yaml" in out.stderr


def test_a_space_lists_offload_choices_and_refuses_bad_ones(tmp_path):
    space = load_space("default")
    assert space.offload[0] == NO_OFFLOAD and Offload(optimizer=True, activations=1.0) in space.offload
    assert load_space("megatron").offload == (NO_OFFLOAD, Offload(optimizer=True))
    assert load_space("torchtitan").offload == (NO_OFFLOAD,)
    raw = yaml.safe_load((searchspace_dir() / "any.yaml").read_text())
    raw["searchspace"]["offload"]["activations"] = [0.5, 2]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(InputError) as err:
        load_space(str(path))
    assert any(p.field == "searchspace.offload.activations" for p in err.value.problems)


def test_stacks_say_how_they_overlap_an_offloaded_step():
    assert builtin_stack("megatron-core").offload_overlap is OffloadOverlap.PIPELINED
    assert builtin_stack("deepspeed").offload_overlap is OffloadOverlap.BACKWARD
    assert builtin_stack("torchtitan").offload_overlap is OffloadOverlap.NONE


def test_the_breakdown_still_sums_to_the_step_with_offload():
    plan = make_plan("llama3-8b", gpus=8, global_batch=64, dp=2, pp=4, schedule=Schedule.ONE_F_ONE_B,
                     recompute=Recompute.NONE).replace(offload=Offload(optimizer=True, activations=1.0))
    pred = evaluate(plan)
    assert pred.breakdown.total == pytest.approx(pred.step_time_s, rel=1e-9)


def test_diff_and_explain_show_what_offload_changes(tmp_path):
    plan = _offloaded()
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(plan.replace(offload=NO_OFFLOAD).to_dict(builtin_model=True)))
    b.write_text(yaml.safe_dump(plan.to_dict(builtin_model=True)))
    out = autoplan("diff", str(a), str(b), "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {"offload.optimizer"} <= {c["field"] for c in doc["changes"]}
    deltas = {d["metric"]: d for d in doc["deltas"]}
    assert deltas["breakdown_s.offload"]["a"] == 0 and deltas["breakdown_s.offload"]["b"] > 0
    assert deltas["host_memory_gib_per_node"]["b"] > 0
    shown = autoplan("explain", str(b))
    assert shown.returncode == 0, shown.stderr
    assert "offload optimizer" in shown.stdout and "host memory per node" in shown.stdout


OFFLOADING = dataclasses.replace(
    load_space("default"), name="offloading", micro_batches=(1, 2), vpp_max=2, cp_max=2,
    schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.ZB_H1),
    zero=(ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS))


@pytest.mark.parametrize(("model", "gpus", "gbs", "seq", "leads", "host_gib"), [
    ("llama3-70b", 8, 16, 4096, True, None),   # nothing fits without offload
    ("llama2-13b", 8, 32, 8192, False, None),  # some groups fit, some only with offload
    ("llama3-70b", 8, 16, 4096, True, 1100),   # the host's memory rules some out
])
def test_the_best_offloading_plans_equal_brute_force(model, gpus, gbs, seq, leads, host_gib):
    """Every candidate the search generates (offload variants included, by its rule)
    evaluated, no pruning: the same top k, byte for byte; and no offload candidate's bound
    exceeds its evaluated step."""
    from autoplan.cost.bounds import step_time_lower_bound
    from autoplan.search.engine import rank_key

    m, c = resolve_model(model), with_gpus(resolve_cluster("dgx-h100"), gpus)
    if host_gib is not None:
        c = dataclasses.replace(c, host_mem_bytes=host_gib * GiB)
    job = Job(global_batch=gbs, seq_len=seq)
    every, too_big = [], 0
    for plan in candidate_plans(m, c, job, OFFLOADING):
        if plan.chunks is not None or plan.stages is not None:
            continue
        pred = evaluate(plan)
        if plan.offload.any:
            assert step_time_lower_bound(plan, stage_work(plan)) <= pred.step_time_s * (1 + 1e-9)
        if pred.feasible:
            every.append((rank_key(plan, pred), plan, pred))
        elif pred.memory.peak <= c.device.mem_bytes:
            too_big += 1  # fits the device, not the host
    assert too_big > 0 or host_gib is None  # the host's memory is what rules those out
    every.sort(key=lambda e: e[0])
    assert any(p.offload.any for _, p, _ in every) and any(
        p.offload.any for _, p, _ in every[:5]) is leads
    found = search(m, c, job, OFFLOADING, top_k=5).plans
    assert [r.plan for r in found] == [p for _, p, _ in every[:5]]
    assert [r.prediction for r in found] == [q for _, _, q in every[:5]]


def test_every_candidate_is_accounted_for_with_offload_variants():
    """Offload variants are generated as the search finds groups that do not fit: each
    counts as generated, then as pruned, infeasible (the host's memory included) or
    evaluated, as every other candidate does."""
    found = search(resolve_model("llama3-70b"), resolve_cluster("dgx-h100"),
                   Job(global_batch=16, seq_len=4096), OFFLOADING, top_k=3)
    s = found.stats
    assert found.plans and all(r.plan.offload.any for r in found.plans)
    assert s.generated == sum(s.pruned.values()) + sum(s.infeasible.values()) + s.evaluated
