"""MoE token dispatch as current stacks run it: the destinations a token's experts span
under DeepSeek's group-limited routing (checked against a simulation of the router
itself), DeepEP's node-deduplicated dispatch and Megatron's all-to-all worked by hand,
the EP A2A overlap, and the rules and files that carry them."""

from __future__ import annotations

import dataclasses
import json
from math import comb
from pathlib import Path

import numpy as np
import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.hf import model_from_hf_config
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.errors import InputError
from autoplan.kernels import comm
from autoplan.parallel import ep
from autoplan.parallel.rules import plan_problems
from autoplan.plans.file import plan_document, read_plan
from autoplan.schedules import Schedule
from autoplan.vocab import Axis, MoeDispatch, Recompute
from tests.helpers import make_plan

V3 = resolve_model("deepseek-v3")
H100 = resolve_cluster("dgx-h100")
INTRA, INTER = H100.intra_node, H100.inter_node
HF = Path(__file__).resolve().parents[1] / "data" / "hf"


# -- where a token's experts are -------------------------------------------------------

def test_unrestricted_routing_misses_a_node_by_the_hypergeometric_by_hand():
    # 256 experts on 8 nodes of 32: a node is missed when all 8 picks fall in the other 224
    miss = comb(224, 8) / comb(256, 8)
    assert ep.touched(256, 8, 8) == pytest.approx(8 * (1 - miss))
    assert ep.touched(8, 2, 8) == pytest.approx(2.0)  # one expert per rank: k ranks
    assert ep.touched(64, 1, 16) == pytest.approx(1.0)


def test_node_limited_routing_reaches_at_most_four_nodes_as_deepseek_v3_states():
    # groups of 32 experts aligned with 8 nodes; a token keeps 4 groups, and since a group
    # is kept for its best experts nearly every kept group holds one of the token's 8:
    # more than the C(96, 8) / C(128, 8) miss rate of picking uniformly within them
    limited = ep.touched(256, 8, 8, groups=8, group_topk=4)
    assert 4 * (1 - comb(96, 8) / comb(128, 8)) < limited <= 4 < ep.touched(256, 8, 8)


def _simulated_nodes(parts: int, tokens: int = 20000) -> float:
    """DeepSeek-V3's router itself (report Sec. 2.1.2; HF modeling_deepseek noaux_tc): i.i.d.
    affinities, a group scored by the sum of its two best, the 4 best of 8 groups kept,
    the top 8 experts among them; the mean count of distinct blocks of 256 / parts."""
    rng = np.random.default_rng(0)
    scores = rng.random((tokens, 256))
    grouped = scores.reshape(tokens, 8, 32)
    group_score = np.sort(grouped, axis=2)[:, :, -2:].sum(axis=2)
    keep = np.argsort(-group_score, axis=1)[:, :4]
    mask = np.zeros((tokens, 8), bool)
    np.put_along_axis(mask, keep, True, axis=1)
    masked = np.where(np.repeat(mask, 32, axis=1), scores, -1.0)
    chosen = np.argsort(-masked, axis=1)[:, :8]
    blocks = chosen // (256 // parts)
    return float(np.mean([len(set(row)) for row in blocks]))


@pytest.mark.parametrize("parts", [4, 8, 16, 32, 64])
def test_touched_blocks_match_a_simulation_of_deepseek_v3s_router(parts: int):
    # nodes of an ep 32 group on 8-GPU nodes (4), nodes of ep 64 (8), and ranks
    assert ep.touched(256, 8, parts, 8, 4) == pytest.approx(_simulated_nodes(parts), rel=0.02)


# -- DeepEP and the all-to-all by hand ---------------------------------------------------

def _v3_plan(**kw):
    args = dict(model=V3, gpus=256, global_batch=512, seq_len=4096, dp=32, pp=8, ep=32,
                micro_batch=1, moe_imbalance=1.0)
    args.update(kw)
    return make_plan(**args)


def test_deepep_sends_each_token_once_per_other_node_and_once_per_gpu_by_hand():
    plan = dataclasses.replace(_v3_plan(), moe_dispatch=MoeDispatch.DEEPEP)
    g = comm.place_group(plan.cluster, 32, 1)  # ep 32: 4 nodes of 8
    assert (g.size, g.per_domain, g.domains) == (32, 8, 4)
    token = 2 * 7168 * 4096  # bf16 hidden vector of each of the rank's 4096 tokens
    # the nodes (4 blocks of 64 experts) and GPUs (32 of 8) a token's experts span
    nodes, gpus = ep.touched(256, 8, 4, 8, 4), ep.touched(256, 8, 32, 8, 4)
    assert 3 < nodes < 3.3 and 6.5 < gpus < 7.2  # the simulated router's counts
    rdma = token * nodes * 3 / 4 / INTER.effective_Bps
    nvl = token * gpus * 7 / 8 / INTRA.effective_Bps
    want = INTER.latency_s + INTRA.latency_s + max(rdma, nvl)
    assert ep.deepep_seconds(V3, _shard(plan), g) == pytest.approx(want)
    moe_layers = stage_work(plan)[1].layers  # a middle stage: every layer MoE
    assert stage_work(plan)[1].comm[Axis.EP][0] == pytest.approx(moe_layers * 2 * want)


def _shard(plan):
    from autoplan.cost.stage import shard_of
    return shard_of(plan)


def test_megatron_all_to_all_sends_every_expert_copy_and_deepep_far_fewer_across_nodes():
    a2a, deepep = _v3_plan(), dataclasses.replace(_v3_plan(), moe_dispatch=MoeDispatch.DEEPEP)
    g = comm.place_group(a2a.cluster, 32, 1)
    routed = 2 * 7168 * 4096 * 8  # one copy per (token, expert)
    chunk = routed / 32
    # 7 peers over NVLink beside 24 over the NIC: the network leg decides
    by_hand = 7 * INTRA.latency_s + 24 * INTER.latency_s + 24 * chunk / INTER.effective_Bps
    assert comm.all_to_all(routed, g) == pytest.approx(by_hand)
    # DeepEP crosses the network with ~2.2 copies per token where the all-to-all sends 6
    assert stage_work(deepep)[1].comm[Axis.EP][0] < 0.45 * stage_work(a2a)[1].comm[Axis.EP][0]


def test_inside_one_node_deepep_sends_a_token_once_per_gpu_not_once_per_expert():
    plan = _v3_plan(gpus=8, dp=8, pp=1, ep=8, global_batch=64)
    deepep = dataclasses.replace(plan, moe_dispatch=MoeDispatch.DEEPEP)
    ratio = stage_work(deepep)[0].comm[Axis.EP][0] / stage_work(plan)[0].comm[Axis.EP][0]
    # copies over NVLink: touched GPUs x 7/8 against top_k x 7/8 (latencies aside)
    assert ratio == pytest.approx(ep.touched(256, 8, 8, 8, 4) / 8, rel=0.02)


# -- EP A2A overlap ------------------------------------------------------------------------

def test_overlap_pairs_all_but_the_warm_up_passes():
    plan = _v3_plan(gpus=8, dp=8, pp=1, ep=8, global_batch=64)  # 8 microbatches, no pipeline
    assert ep.overlapped_passes(plan) == pytest.approx(7 / 8)
    inter = _v3_plan(pp=8, vpp=2, schedule=Schedule.INTERLEAVED, global_batch=1024)
    # m = 32 microbatches x 2 chunks; (8 - 1) + (2 - 1) * 8 = 15 unpaired on average
    assert ep.overlapped_passes(inter) == pytest.approx((64 - 15) / 64)


def test_overlap_hides_dispatch_under_the_paired_pass_and_pays_the_shared_sms():
    plan = _v3_plan(gpus=8, dp=8, pp=1, ep=8, global_batch=64)
    on = dataclasses.replace(plan, ep_overlap=True)
    off_w, on_w = stage_work(plan)[0], stage_work(on)[0]
    ep_f, ep_b = off_w.comm[Axis.EP]
    share, slow = 7 / 8, plan.stack.comm_compute_slowdown
    backward = off_w.compute_b + off_w.compute_w
    assert ep_f < backward and ep_b < off_w.compute_f  # all of it fits under the other pass
    assert on_w.comm[Axis.EP][0] == pytest.approx((1 - share) * ep_f + share * slow * ep_f)
    assert on_w.comm[Axis.EP][1] == pytest.approx((1 - share) * ep_b + share * slow * ep_b)
    assert evaluate(on).step_time_s < evaluate(plan).step_time_s


def test_overlap_rules_follow_megatron_core():
    base = _v3_plan(pp=8, vpp=2, schedule=Schedule.INTERLEAVED, global_batch=1024)
    assert not [f for f, _ in plan_problems(dataclasses.replace(base, ep_overlap=True))
                if f == "ep_overlap"]
    full = dataclasses.replace(base, ep_overlap=True, recompute=Recompute.FULL)
    assert ("ep_overlap" in dict(plan_problems(full)))
    no_vpp = dataclasses.replace(_v3_plan(), ep_overlap=True)
    assert "interleaved" in dict(plan_problems(no_vpp))["ep_overlap"]
    dense = make_plan(gpus=8, dp=8)
    assert "moe_dispatch" in dict(plan_problems(dataclasses.replace(
        dense, moe_dispatch=MoeDispatch.DEEPEP)))


def test_plan_files_carry_the_dispatch_and_the_overlap():
    qwen = make_plan("qwen3-30b-a3b", gpus=32, global_batch=256, dp=8, pp=4, vpp=2, ep=8,
                     schedule=Schedule.INTERLEAVED)
    plan = dataclasses.replace(qwen, moe_dispatch=MoeDispatch.DEEPEP, ep_overlap=True)
    doc = plan.to_dict()
    assert (doc["moe_dispatch"], doc["ep_overlap"]) == ("deepep", True)
    assert "moe_dispatch" not in qwen.to_dict()
    back = read_plan(plan_document(plan, evaluate(plan)), "p.yaml")
    assert (back.moe_dispatch, back.ep_overlap) == (MoeDispatch.DEEPEP, True)
    with pytest.raises(InputError, match="p.yaml: moe_dispatch"):
        read_plan({**doc, "moe_dispatch": "nccl"}, "p.yaml")
    with pytest.raises(InputError, match="p.yaml: ep_overlap"):
        read_plan({**dataclasses.replace(qwen, layout=dataclasses.replace(
            qwen.layout, vpp=1), schedule=Schedule.ONE_F_ONE_B).to_dict(), "ep_overlap": True},
            "p.yaml")


# -- routing groups from files -------------------------------------------------------------

def test_hf_configs_give_deepseeks_routing_groups():
    data = json.loads((HF / "DeepSeek-V3.json").read_text())
    v3 = model_from_hf_config(data, "DeepSeek-V3.json")
    assert (v3.route_groups, v3.route_group_topk) == (8, 4)
    lite = model_from_hf_config(json.loads((HF / "DeepSeek-V2-Lite.json").read_text()), "lite")
    assert (lite.route_groups, lite.route_group_topk) == (0, 0)  # topk_method greedy
    with pytest.raises(InputError, match="n_group"):
        model_from_hf_config({**data, "n_group": 7}, "bad.json")
    with pytest.raises(InputError, match="topk_group"):
        model_from_hf_config({**data, "topk_group": 9}, "bad.json")


def test_model_files_check_the_routing_groups(tmp_path: Path):
    from autoplan.descriptors.library import resolve_model as resolve
    doc = {"model": {**V3.to_dict(), "route_groups": 7}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="route_groups"):
        resolve(str(path))
    path.write_text(json.dumps({"model": {**V3.to_dict(), "route_group_topk": 9}}))
    with pytest.raises(InputError, match="route_group_topk"):
        resolve(str(path))
    assert with_gpus(H100, 8).gpus == 8


# -- the search's choice ---------------------------------------------------------------------

def test_the_search_takes_deepep_where_its_space_runs_it_and_it_is_faster():
    from autoplan.descriptors.space import load_space
    from autoplan.plan import Layout

    megatron, titan = load_space("megatron"), load_space("torchtitan")
    assert megatron.moe_dispatch == (MoeDispatch.ALLTOALL, MoeDispatch.DEEPEP)
    assert titan.moe_dispatch == (MoeDispatch.ALLTOALL,)
    cluster = with_gpus(H100, 256)
    across = Layout(dp=32, tp=1, pp=8, ep=32, etp=1)
    assert ep.dispatch_for(V3, cluster, across, megatron, 4096) is MoeDispatch.DEEPEP
    assert ep.dispatch_for(V3, cluster, across, titan, 4096) is MoeDispatch.ALLTOALL
    no_ep = Layout(dp=32, tp=1, pp=8, ep=1, etp=1)
    assert ep.dispatch_for(V3, cluster, no_ep, megatron, 4096) is MoeDispatch.ALLTOALL
    dense = resolve_model("llama3-8b")
    assert ep.dispatch_for(dense, cluster, Layout(dp=256, tp=1, pp=1), megatron, 4096) is MoeDispatch.ALLTOALL


def test_space_rules_refuse_a_dispatcher_the_launcher_does_not_run():
    from autoplan.descriptors.space import load_space
    from autoplan.parallel.rules import space_problems

    plan = dataclasses.replace(_v3_plan(), moe_dispatch=MoeDispatch.DEEPEP)
    assert "moe_dispatch" in dict(space_problems(plan, load_space("torchtitan")))
    assert "moe_dispatch" not in dict(space_problems(plan, load_space("megatron")))


# -- what an MoE layer keeps ----------------------------------------------------------------

def test_megatron_core_keeps_no_expert_outputs_since_probs_scale_the_activation():
    from autoplan.cost.stage import shard_of
    from autoplan.kernels.memory import moe_mlp_activation_bytes

    plan = _v3_plan()
    core = shard_of(plan)
    assert core.moe_probs_in_activation  # megatron-core.yaml: MCore >= 0.13
    scaled = dataclasses.replace(core, moe_probs_in_activation=False)
    copies = 4096 * 8  # tokens x top_k, imbalance 1
    # by hand, per copy: expert input h, fc1 output 2f, fc2 input f (bf16); the scaling
    # combine would keep each expert output (h) as well
    router = 4096 * 256 * 4
    shared = 4096 * 2 * 3 * 2048
    kept = copies * 2 * (7168 + 3 * 2048)
    assert moe_mlp_activation_bytes(V3, core) == pytest.approx(router + shared + kept)
    assert moe_mlp_activation_bytes(V3, scaled) - moe_mlp_activation_bytes(V3, core) == \
        pytest.approx(copies * 2 * 7168)
