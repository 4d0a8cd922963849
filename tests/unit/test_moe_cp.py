"""Expert and context parallelism: degree rules, and the all-to-all, expert and ring
volumes worked by hand from the alpha-beta model (not from the functions under test)."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import _layer_times, shard_of, stage_memory, stage_work
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import load_space
from autoplan.kernels import comm, flops
from autoplan.parallel.pp import dense_per_stage as stage_dense_layers
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Layout
from autoplan.plans.file import plan_document, read_plan
from autoplan.schedules import Schedule
from autoplan.search.engine import search
from autoplan.vocab import Activation, Axis, CpComm, Position, ZeroStage
from tests.helpers import make_plan

MOE = Model(name="tiny-moe", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096,
            vocab=1024, activation=Activation.SWIGLU, position=Position.ROPE,
            tied_embeddings=False, max_seq_len=4096, experts=8, top_k=2, moe_ffn_hidden=2048,
            dense_layers=1)

H100 = resolve_cluster("dgx-h100")
INTRA, INTER = H100.intra_node, H100.inter_node


# -- all-to-all -----------------------------------------------------------------------

def test_all_to_all_inside_a_node_is_pairwise_exchange_over_nvlink():
    g = comm.place_group(with_gpus(H100, 8), 8, 1)
    n = 8e6
    expected = 7 * (INTRA.latency_s + n / 8 / INTRA.effective_Bps)
    assert comm.all_to_all(n, g) == pytest.approx(expected)


def test_all_to_all_across_nodes_sends_the_far_chunks_over_the_nic_beside_nvlink():
    g = comm.place_group(with_gpus(H100, 32), 16, 1)  # two nodes of 8
    n = 16e6
    chunk = n / 16
    # by hand: 7 near peers over NVLink and 8 far ones over the NIC, at once; the NIC's
    # 8 chunks take longer than NVLink's 7, so the call is the network leg plus latencies
    latency = 7 * INTRA.latency_s + 8 * INTER.latency_s
    network = 8 * chunk / INTER.effective_Bps
    assert network > 7 * chunk / INTRA.effective_Bps
    assert comm.all_to_all(n, g) == pytest.approx(latency + network)


def test_all_to_all_with_a_stride_of_a_node_is_all_network():
    g = comm.place_group(with_gpus(H100, 32), 4, 8)
    expected = 3 * (INTER.latency_s + 1e6 / INTER.effective_Bps)
    assert comm.all_to_all(4e6, g) == pytest.approx(expected)
    assert comm.all_to_all(4e6, comm.place_group(with_gpus(H100, 32), 1, 8)) == 0.0


# -- expert parallel ------------------------------------------------------------------

def _moe_plan(**kw):
    args = dict(model=MOE, gpus=8, global_batch=64, seq_len=1024, dp=8, ep=8, etp=1)
    args.update(kw)
    return make_plan(**args)


def test_dispatch_and_combine_volume_by_hand():
    plan = _moe_plan()
    # each rank routes its 1024 tokens to top_k = 2 experts; the busiest rank takes
    # 1.25x the mean (Switch capacity factor); 2 bytes x hidden per token copy
    routed = 1024 * 2 * 1.25 * 1024 * 2
    a2a = 7 * (INTRA.latency_s + routed / 8 / INTRA.effective_Bps)
    work = stage_work(plan)[0]
    moe_layers = 3  # 4 layers, the first dense
    assert work.comm[Axis.EP][0] == pytest.approx(moe_layers * 2 * a2a)  # dispatch + combine
    assert work.comm[Axis.EP][1] == pytest.approx(moe_layers * 2 * a2a)
    pred = evaluate(plan)
    assert pred.breakdown.ep_comm == pytest.approx(plan.num_microbatches * 2 * work.comm[Axis.EP][0])


def test_expert_tensor_parallel_adds_a_gather_and_a_scatter_of_the_routed_tokens():
    plan = _moe_plan(tp=2, dp=4, ep=4, etp=2, sequence_parallel=True)
    routed = 1024 / 2 * 2 * 1.25 * 1024 * 2  # SP: each TP rank routes half the tokens
    ep_group = comm.place_group(plan.cluster, 4, 2)
    a2a = 3 * (INTRA.latency_s + routed / 4 / INTRA.effective_Bps)
    assert comm.all_to_all(routed, ep_group) == pytest.approx(a2a)
    gathered = routed * 2
    # one ring step of 2 ranks, NCCL's Simple protocol at this size (8.4 us base latency)
    phase = 8.4e-6 + INTRA.latency_s + gathered / 2 / INTRA.effective_Bps
    assert stage_work(plan)[0].comm[Axis.EP][0] == pytest.approx(3 * (2 * a2a + 2 * phase))


def test_imbalance_scales_the_expert_work_and_traffic():
    even, skewed = _moe_plan(moe_imbalance=1.0), _moe_plan(moe_imbalance=2.0)
    routed = 1024 * 2 * 1.0 * 1024 * 2  # even routing: the mean volume
    bandwidth = 3 * 2 * 7 * routed / 8 / INTRA.effective_Bps  # 3 MoE layers, 2 all-to-alls
    # twice the tokens: the latency terms stay, the bandwidth terms double
    skewed_ep, even_ep = stage_work(skewed)[0].comm[Axis.EP][0], stage_work(even)[0].comm[Axis.EP][0]
    assert skewed_ep - even_ep == pytest.approx(bandwidth)
    assert stage_work(skewed)[0].compute_f > stage_work(even)[0].compute_f
    capped = _moe_plan(model=dataclasses.replace(MOE, capacity_factor=1.0), moe_imbalance=2.0)
    assert stage_work(capped)[0].comm[Axis.EP][0] == pytest.approx(stage_work(even)[0].comm[Axis.EP][0])


def test_expert_weights_are_sharded_by_ep_and_their_optimizer_by_edp():
    one, eight = _moe_plan(ep=1, zero=ZeroStage.OPTIMIZER), _moe_plan(ep=8, zero=ZeroStage.OPTIMIZER)
    w1, w8 = stage_work(one)[0], stage_work(eight)[0]
    per_expert = 3 * 1024 * 2048
    assert w1.expert_params == 3 * 8 * per_expert
    assert w8.expert_params == 3 * 1 * per_expert
    m1 = stage_memory(one, 0, w1, 1)
    m8 = stage_memory(eight, 0, w8, 1)
    assert m1.weights - m8.weights == pytest.approx(2 * 3 * 7 * per_expert)
    # ep = 8 on 8 ranks leaves one replica of each expert: nothing to shard its
    # optimizer over (edp = 1), while dense states shard over dp = 8
    assert eight.layout.edp == 1 and one.layout.edp == 8
    assert m8.optimizer == pytest.approx(12 * w8.params / 8 + 12 * w8.expert_params)


def test_mfu_counts_the_routed_experts_a_token_uses():
    """An MoE layer does the GEMM work of a dense MLP of top_k * expert width, plus the
    router's 2 * hidden * experts per token."""
    dense_equiv = dataclasses.replace(MOE, experts=0, top_k=0, moe_ffn_hidden=0,
                                      dense_layers=0, ffn_hidden=2 * 2048)
    dense_first = dataclasses.replace(dense_equiv, ffn_hidden=4096)
    s, tokens = 1024, 1024 * 64
    want = 3 * tokens * (flops.layer_forward_flops_per_token(dense_first, s)
                         + 3 * (flops.layer_forward_flops_per_token(dense_equiv, s) + 2 * 1024 * 8)
                         + flops.logit_forward_flops_per_token(MOE))
    assert flops.model_flops_per_step(MOE, tokens, s) == pytest.approx(want)


def test_mla_attention_core_uses_the_wider_query_key_heads():
    m = resolve_model("deepseek-v3")
    # DeepSeek-V3: 128 heads, q/k 128 + 64, v 128; causal halves 2*s*(d_qk + d_v) per head
    assert flops.attention_core_flops_per_token(m, 4096) == 4096 * 128 * (192 + 128)


@pytest.mark.parametrize(("stages", "vpp", "schedule", "want"), [
    (None, 1, Schedule.ONE_F_ONE_B, (1, 0)),
    ((1, 3), 1, Schedule.ONE_F_ONE_B, (1, 0)),
    (None, 2, Schedule.INTERLEAVED, (1, 0)),
    (None, 2, Schedule.ZB_V, (1, 0)),
])
def test_dense_first_layers_land_on_the_first_stage(stages, vpp, schedule, want):
    plan = _moe_plan(gpus=16, dp=8, pp=2, vpp=vpp, schedule=schedule, stages=stages)
    assert stage_dense_layers(plan) == want


def test_dense_layers_follow_the_chunk_order_of_interleaving():
    model = dataclasses.replace(MOE, layers=8, dense_layers=3)
    plan = _moe_plan(model=model, gpus=16, dp=8, pp=2, vpp=2, schedule=Schedule.INTERLEAVED)
    # chunks of 2 layers: virtual stages 0,1,2,3 hold layers 0-1, 2-3, 4-5, 6-7;
    # stage 0 holds virtual 0 and 2 (2 dense), stage 1 virtual 1 and 3 (1 dense)
    assert stage_dense_layers(plan) == (2, 1)


# -- context parallel ----------------------------------------------------------------

def test_ring_exposes_what_a_step_cannot_hide_behind_its_attention():
    plan = make_plan(gpus=16, dp=1, cp=16, seq_len=4096, global_batch=8)
    m = plan.model
    kv_chunk = 2 * (4096 / 16) * 2 * m.kv_dim  # bf16 K and V of this rank's 256 tokens
    step = INTER.latency_s + kv_chunk / INTER.effective_Bps  # the ring crosses nodes
    lt = _layer_times(m, shard_of(plan), plan.cluster.device)
    want_f = 15 * max(0.0, step - lt.attention_forward / 16)
    want_b = 15 * max(0.0, 2 * step - lt.attention_backward / 16)
    work = stage_work(plan)[0]
    assert want_f > 0
    assert work.comm[Axis.CP][0] == pytest.approx(m.layers * want_f)
    assert work.comm[Axis.CP][1] == pytest.approx(m.layers * want_b)


def test_ring_hides_its_transfers_behind_long_attention():
    plan = make_plan(gpus=8, dp=1, cp=8, seq_len=131072, global_batch=8)
    assert stage_work(plan)[0].comm[Axis.CP][0] == 0.0


def test_ulysses_exchanges_qkv_before_and_the_output_after_attention():
    plan = make_plan(gpus=8, dp=1, cp=8, seq_len=8192, global_batch=8, cp_comm=CpComm.A2A)
    m = plan.model
    tokens = 8192 / 8
    qkv = 2 * tokens * (m.q_dim + 2 * m.kv_dim)
    out = 2 * tokens * m.q_dim
    g = comm.place_group(plan.cluster, 8, 1)
    want = sum(7 * (INTRA.latency_s + n / 8 / INTRA.effective_Bps) for n in (qkv, out))
    assert comm.all_to_all(qkv, g) + comm.all_to_all(out, g) == pytest.approx(want)
    work = stage_work(plan)[0]
    assert work.comm[Axis.CP][0] == pytest.approx(m.layers * want)
    assert work.comm[Axis.CP][1] == pytest.approx(m.layers * want)


def test_activations_are_divided_by_cp():
    one = make_plan(gpus=8, dp=8, seq_len=8192)
    four = make_plan(gpus=8, dp=2, cp=4, seq_len=8192, global_batch=64)
    a1 = stage_memory(one, 0, stage_work(one)[0], 1).activations
    a4 = stage_memory(four, 0, stage_work(four)[0], 1).activations
    assert a4 == pytest.approx(a1 / 4, rel=1e-6)


# -- degree rules --------------------------------------------------------------------

def _fields(plan):
    return {f for f, _ in plan_problems(plan)}


def test_ep_must_divide_the_experts():
    assert "layout.ep" in _fields(_moe_plan(ep=3, dp=8))


def test_ep_times_etp_must_divide_a_stages_ranks():
    plan = _moe_plan(gpus=8, dp=4, tp=2, ep=8, etp=2, sequence_parallel=True)
    assert any("ep*etp" in msg for _, msg in plan_problems(plan))
    assert not plan_problems(_moe_plan(gpus=8, dp=4, tp=2, ep=8, etp=1, sequence_parallel=True))


def test_ep_may_fold_over_tp_and_cp_ranks():
    plan = _moe_plan(gpus=8, dp=1, tp=2, cp=4, ep=8, etp=1, sequence_parallel=True,
                     global_batch=8)
    assert plan_problems(plan) == []


def test_dense_models_take_no_expert_parallelism():
    assert "layout.ep" in _fields(make_plan(dp=4, ep=2, gpus=4, global_batch=8))


def test_moe_with_tensor_parallel_needs_sequence_parallel():
    assert "sequence_parallel" in _fields(_moe_plan(tp=2, dp=4, ep=4, etp=1))


def test_ulysses_needs_cp_to_divide_the_heads_per_tp_rank():
    # llama3-8b: 32 heads, 8 kv heads; tp 2 leaves 16 and 4; cp 8 divides 16, is a multiple of 4
    ok = make_plan(gpus=16, dp=1, tp=2, cp=8, sequence_parallel=True, cp_comm=CpComm.A2A,
                   global_batch=8)
    assert plan_problems(ok) == []
    bad = make_plan(gpus=24, dp=1, tp=8, cp=3, seq_len=6144, sequence_parallel=True,
                    cp_comm=CpComm.A2A, global_batch=8)
    assert "cp_comm" in _fields(bad)


def test_plan_file_round_trips_ep_etp_cp_comm_and_imbalance(tmp_path):
    plan = _moe_plan(gpus=16, dp=2, tp=2, cp=4, ep=4, etp=1, sequence_parallel=True,
                     cp_comm=CpComm.A2A, moe_imbalance=1.5, global_batch=8)
    doc = plan_document(plan, evaluate(plan))
    assert doc["layout"]["etp"] == 1 and doc["cp_comm"] == "a2a"
    assert doc["job"]["moe_imbalance"] == 1.5
    assert doc["prediction"]["mfu_basis"] == "active parameters"
    again = read_plan(doc, "plan.yaml", correct=False)  # analytic: the door adds measured grids
    assert again == plan


def test_etp_defaults_to_tp_as_in_megatron():
    assert Layout(dp=1, tp=4, pp=1).etp == 4


def test_a_layouts_degrees_are_set_at_construction_never_back_filled():
    """STYLE.md 6: an etp or dp_shard not given is resolved before any field is written (no
    ``__post_init__`` overwrites one); given and defaulted layouts are one value, one hash,
    and ``dataclasses.replace`` keeps the degrees it is not told to change."""
    lay = Layout(dp=8, tp=2, pp=2)
    assert (lay.etp, lay.dp_shard) == (2, 8)
    explicit = Layout(dp=8, tp=2, pp=2, cp=1, ep=1, vpp=1, etp=2, dp_shard=8)
    assert lay == explicit and hash(lay) == hash(explicit)
    assert not hasattr(Layout, "__post_init__")
    assert dataclasses.replace(lay, dp_shard=4) == Layout(dp=8, tp=2, pp=2, dp_shard=4)
    assert dataclasses.replace(lay, tp=4).etp == 2  # a given etp stays as it was
    assert Layout(dp=4, tp=4, pp=1, ep=4, etp=1).etp == 1
    assert Layout(dp=8, tp=2, pp=2, etp=0, dp_shard=0) == lay  # 0 still means "as tp", "as dp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.etp = 1  # type: ignore[misc]


# -- search ----------------------------------------------------------------------------

def test_search_explores_ep_and_etp_within_the_rules():
    cluster = with_gpus(H100, 16)
    job = Job(global_batch=64, seq_len=2048)
    result = search(MOE, cluster, job, load_space("default"), top_k=30)
    assert result.plans
    seen = set()
    for r in result.plans:
        assert plan_problems(r.plan) == []
        lay = r.plan.layout
        seen.add((lay.ep, lay.etp == lay.tp))
        if lay.ep > 1:
            assert r.prediction.breakdown.ep_comm > 0
    assert any(ep > 1 for ep, _ in seen)


def test_spaces_without_expert_parallel_keep_ep_at_one():
    cluster = with_gpus(H100, 16)
    result = search(MOE, cluster, Job(global_batch=64, seq_len=2048), load_space("deepspeed"))
    assert result.plans and all(r.plan.layout.ep == 1 for r in result.plans)
