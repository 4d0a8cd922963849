"""autoplan bench: the tiny preset end to end on this CPU, through the library and the
command line, judged by the profile contract (autoplan/measured/profile.py); bad input and
failing workers end in one clear message, and no worker outlives its run.

Tests that run kernels need torch (the optional ``bench`` extra) and skip without it. They
run torch on one thread: on a shared 2-core machine, OpenMP threads that spin at barriers
while another process holds the cores slow small kernels down tenfold.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoplan.bench import collectives as coll
from autoplan.bench.micro import model_gemm_shapes, plan_micro
from autoplan.bench.presets import get_preset
from autoplan.bench.timing import Budget, summarize
from autoplan.descriptors.library import resolve_model
from autoplan.measured.profile import BENCH_KINDS, REQUIRED_META, Profile, parse_profile, read_profile
from tests.helpers import autoplan

ROOT = Path(__file__).resolve().parents[2]
# llama3-8b (hidden 4096, 32 heads, 8 KV heads of 128, ffn 14336, vocab 128256) on one of
# 8 TP ranks, 16 tokens: QKV (4096 + 2 x 1024) / 8, out 4096 / 8, SwiGLU up+gate 2 x 14336 / 8,
# down 14336 / 8, logits 128256 / 8 (Shoeybi et al. 2019's column/row split)
LLAMA3_8B_TP8_16 = {(16, 768, 4096), (16, 4096, 512), (16, 3584, 4096), (16, 4096, 1792),
                    (16, 16032, 4096)}


# not under torchrun: the command is its own writer (autoplan.bench.run.is_writer)
NOT_A_WORKER = {"RANK": None, "WORLD_SIZE": None}
# ... and on the one torch thread the test sets: without OMP_NUM_THREADS a world of one
# takes every core (autoplan.bench.run.run_bench), two threads that wait on each other
# while the suite's other worker holds the second core (13 s of CPU for the tiny preset
# on a busy 2-core machine, 2.7 s on one thread); a world of two keeps its one thread a
# rank either way (``tiny_profile``)
ONE_THREAD = {**NOT_A_WORKER, "OMP_NUM_THREADS": "1"}


def assert_bad_input(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"


def assert_valid_profile(profile: Profile, kinds: tuple[str, ...] = tuple(BENCH_KINDS)) -> None:
    rows = profile.rows
    assert set(rows["kind"]) == set(kinds)
    assert (rows["seconds"] > 0).all() and (rows["repeats"] > 0).all()
    assert (rows["seconds_p10"] <= rows["seconds"]).all()
    assert (rows["seconds"] <= rows["seconds_p90"]).all()
    for key in REQUIRED_META:
        assert profile.meta[key], key


# -- planning: no torch needed ------------------------------------------------------------

def test_gemm_shapes_are_the_cost_models_sharded_layer_shapes() -> None:
    assert set(model_gemm_shapes(resolve_model("llama3-8b"), tp=8, tokens=16)) == LLAMA3_8B_TP8_16


def test_moe_model_shapes_include_the_router_and_the_dense_first_layers() -> None:
    dsv3 = resolve_model("deepseek-v3")
    shapes = model_gemm_shapes(dsv3, tp=8, tokens=64)
    assert (64, dsv3.experts, dsv3.hidden) in shapes  # router
    assert (64, 2 * dsv3.ffn_hidden // 8, dsv3.hidden) in shapes  # a dense-first layer's up+gate


def test_a_hybrid_models_shapes_are_each_layer_kinds_projections() -> None:
    """Nemotron-H at tp 8: Mamba-2's in_proj (z, x, B, C, dt over 8 ranks) and out_proj,
    the attention layers' QKV, the ReLU^2 MLP's up projection (kernels/mixers.py)."""
    m = resolve_model("nemotron-h-56b")
    shapes = model_gemm_shapes(m, tp=8, tokens=64)
    inner, bc = m.mamba_inner, 2 * m.ssm_groups * m.ssm_state
    assert (64, (2 * inner + bc + m.mamba_heads) // 8, m.hidden) in shapes  # Mamba in_proj
    assert (64, m.hidden, inner // 8) in shapes  # Mamba out_proj
    assert (64, m.ffn_hidden // 8, m.hidden) in shapes  # the MLP layers' up projection


def test_caps_drop_big_shapes_and_say_so() -> None:
    preset = get_preset("default", "cpu")
    plan = plan_micro(preset, [resolve_model("llama3-8b")])
    flops = [2 * c.m * c.n * c.k for c in plan.cases if type(c).__name__ == "GemmCase"]
    assert flops and max(flops) <= max(preset.max_gemm_flops.values())
    assert any("GEMM shapes over" in note for note in plan.skipped)


def test_mla_attention_is_left_out_with_a_reason() -> None:
    plan = plan_micro(get_preset("tiny", "cpu"), [resolve_model("deepseek-v3")])
    assert not [c for c in plan.cases if type(c).__name__ == "AttentionCase"]
    assert any("MLA" in note for note in plan.skipped)


def test_collective_groups_are_powers_of_two_up_to_the_world() -> None:
    assert coll.group_sizes(1) == []
    assert coll.group_sizes(6) == [2, 4]
    assert coll.group_sizes(8) == [2, 4, 8]


def test_p2p_crosses_nodes_when_the_world_spans_them() -> None:
    spec = coll.Spec(device_kind="cuda", dtype="bf16", message_bytes=(1024,),
                     budget=Budget(warmup=1, min_repeats=1, max_repeats=1, seconds=0), timeout_s=1, threads=1)
    p2p = [c for c in coll.plan_collectives(spec, world=16, per_node=8) if c.op == "p2p"]
    assert [(c.ranks, c.ranks_per_node) for c in p2p] == [((0, 1), 2), ((0, 8), 1)]
    groups = [(len(c.ranks), c.ranks_per_node) for c in coll.plan_collectives(spec, 16, 8)
              if c.op == "all_reduce"]
    assert groups == [(2, 2), (4, 4), (8, 8), (16, 8)]


@pytest.mark.parametrize(("cuda_name", "descriptor"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA GB200", "gb200"), ("NVIDIA B200", "b200"), ("NVIDIA H100 PCIe", None),
    ("NVIDIA H200 NVL", None), ("AMD Instinct MI300X", "mi300x"),
])
def test_cuda_device_names_map_to_built_in_descriptors(cuda_name: str, descriptor: str | None) -> None:
    from autoplan.bench.run import descriptor_name

    assert descriptor_name("cuda", cuda_name, None) == descriptor
    assert descriptor_name("cuda", cuda_name, "h200") == "h200"  # --descriptor wins
    assert descriptor_name("cpu", "AMD EPYC", None) is None


def test_percentiles_bracket_the_median() -> None:
    t = summarize([3.0, 1.0, 2.0, 10.0, 4.0])
    assert t.seconds_p10 <= t.seconds == 3.0 <= t.seconds_p90 and t.repeats == 5


def test_without_torch_the_command_says_how_to_get_it() -> None:
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['autoplan', 'bench', '--preset', 'tiny'];"
            "from autoplan.cli.main import main; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            timeout=60, check=False)
    assert_bad_input(result, "autoplan bench needs torch: pip install 'autoplan[bench]'")


# -- running on this CPU --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_profile() -> Profile:
    torch = pytest.importorskip("torch")
    from autoplan.bench.run import run_bench
    from autoplan.measured.profile import format_profile

    seen: list[tuple[int, int]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        meta, rows = run_bench(device="cpu", preset="tiny", world=2, command="pytest tiny",
                               progress=lambda done, total, label: seen.append((done, total)))
    finally:
        torch.set_num_threads(threads)
    assert seen and seen[-1][0] == seen[-1][1]  # progress reached its total
    assert not multiprocessing.active_children()  # every worker joined
    return parse_profile(format_profile(meta, rows), "<tiny>")


# slow: their module-scoped tiny_profile runs the bench (about 10 s), whichever comes first
@pytest.mark.torch
@pytest.mark.slow
def test_tiny_profile_has_every_kind_and_sane_timings(tiny_profile: Profile) -> None:
    assert_valid_profile(tiny_profile)
    for kind, ops in BENCH_KINDS.items():
        written = {"linear"} if kind == "gemm" else set(ops)  # matmul: profiles of before 2026-11-26
        assert set(tiny_profile.rows.loc[tiny_profile.rows["kind"] == kind, "op"]) == written, kind


@pytest.mark.torch
@pytest.mark.slow
def test_tiny_profile_header_names_device_software_and_command(tiny_profile: Profile) -> None:
    meta = tiny_profile.meta
    assert meta["device_kind"] == "cpu" and meta["torch"] and meta["command"] == "pytest tiny"
    assert meta["date"].endswith("+00:00") and meta["preset"] == "tiny" and meta["world_size"] == "2"
    assert "descriptor" not in meta  # a CPU is no built-in device


@pytest.mark.torch
@pytest.mark.slow
def test_tiny_profile_measures_the_models_sharded_gemms(tiny_profile: Profile) -> None:
    """Every shape in fp32; in bf16 those under the tiny preset's cap, the others named
    as skipped (bf16 is slow without hardware support)."""
    gemm = tiny_profile.of_kind("gemm")
    cap = get_preset("tiny", "cpu").max_gemm_flops["bf16"]
    for dtype, shapes in (("fp32", LLAMA3_8B_TP8_16),
                          ("bf16", {s for s in LLAMA3_8B_TP8_16 if 2 * s[0] * s[1] * s[2] <= cap})):
        mine = gemm[gemm["dtype"] == dtype]
        assert shapes <= set(zip(mine["m"], mine["n"], mine["k"], strict=True)), dtype
    assert len(shapes) >= 3 and "GEMM shapes over" in tiny_profile.meta["capped"]


@pytest.mark.torch
@pytest.mark.slow
def test_tiny_profile_attention_is_causal_gqa_after_tp(tiny_profile: Profile) -> None:
    attn = tiny_profile.of_kind("attention")
    assert set(zip(attn["heads"], attn["kv_heads"], attn["head_dim"], attn["causal"], strict=True)) \
        == {(4, 1, 128, 1)}  # llama3-8b's 32 heads and 8 KV heads over 8 TP ranks


@pytest.mark.torch
@pytest.mark.slow
def test_tiny_profile_collectives_ran_on_two_processes(tiny_profile: Profile) -> None:
    c = tiny_profile.of_kind("collective")
    assert set(c["ranks"]) == {2} and set(c["ranks_per_node"]) == {2}
    assert set(c["nbytes"]) == {4 * 1024, 256 * 1024}
    assert "skipped" not in tiny_profile.meta  # gloo runs all five ops in torch >= 2.5


@pytest.mark.torch
@pytest.mark.slow
def test_tiny_profile_sums_in_bf16_and_times_the_eager_layers_passes(tiny_profile: Profile) -> None:
    """The reducing collectives in fp32 and in bf16 (what tensor parallelism sums), the
    others in fp32; and the layer validate trains, its memory-bound passes timed with the
    bytes the cost model counts for them (forward, and twice that backward)."""
    from autoplan.bench.micro import _shard
    from autoplan.kernels.layer import elementwise_bytes_forward

    c = tiny_profile.of_kind("collective")
    assert set(zip(c["op"], c["dtype"], strict=True)) == (
        {(op, "fp32") for op in coll.OPS} | {("all_reduce", "bf16"), ("reduce_scatter", "bf16")})
    layer = tiny_profile.rows[tiny_profile.rows["op"] == "layer"]
    model = resolve_model("llama3-8b")
    columns = ("kind", "dtype", "n", "seq", "nbytes")
    assert [tuple(r[c] for c in columns) for r in layer.to_dict("records")] == [
        ("elementwise", "bf16", 4096, 64, round(3 * elementwise_bytes_forward(model, _shard(8, 64))))]
    assert tiny_profile.meta["autoplan-profile"] == "3"


@pytest.mark.torch
def test_cli_writes_a_profile_and_prints_a_summary(tmp_path: Path) -> None:
    """One process (world 1) on the example's tiny model: the collectives' workers the
    bench spawns are ``tiny_profile``'s (world 2, the same code), and a new interpreter
    only adds torch's import."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "sub" / "cpu.csv"
    model = ROOT / "examples" / "cpu" / "tiny-llama.yaml"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = autoplan("bench", "--device", "cpu", "--preset", "tiny", "--world", "1",
                          "--model", model, "-o", out, env=ONE_THREAD)
    finally:
        torch.set_num_threads(threads)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    profile = read_profile(out)
    assert_valid_profile(profile, ("gemm", "attention", "elementwise", "host"))
    assert profile.meta["command"] == (f"autoplan bench --device cpu --preset tiny --world 1 "
                                       f"--model {model} -o {out}")
    assert "best GEMM fp32 TFLOP/s" in result.stdout
    assert not list(out.parent.glob(".*.tmp"))


@pytest.mark.torch
def test_cli_world_of_one_writes_the_csv_to_stdout_without_collectives() -> None:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = autoplan("bench", "--device", "cpu", "--preset", "tiny", "--world", "1",
                          "--model", ROOT / "examples" / "cpu" / "tiny-llama.yaml", env=ONE_THREAD)
    finally:
        torch.set_num_threads(threads)
    assert result.returncode == 0, result.stderr
    profile = parse_profile(result.stdout, "<stdout>")
    assert_valid_profile(profile, ("gemm", "attention", "elementwise", "host"))
    assert "world size 1" in profile.meta["skipped_collectives"]


@pytest.mark.parametrize(("args", "needles"), [
    (["--model", "llama3-8b,no-such-model"], ["--model", "unknown model 'no-such-model'"]),
    (["--device", "cuda"], ["--device", "no CUDA device"]),
    (["--device", "tpu"], ["--device", "expected one of cpu, cuda"]),
    (["--preset", "huge"], ["--preset", "expected one of tiny, default, full"]),
    (["--world", "0"], ["--world", "at least 1"]),
    (["--descriptor", "h1000"], ["--descriptor", "unknown device 'h1000'"]),
])
@pytest.mark.torch
def test_bad_input_exits_2_with_one_clear_message(args: list[str], needles: list[str],
                                                  tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "never.csv"
    result = autoplan("bench", "--device", "cpu", "--preset", "tiny", *args, "-o", out, env=NOT_A_WORKER)
    assert_bad_input(result, *needles)
    assert not out.exists()


@pytest.mark.torch
def test_attention_without_in_kernel_gqa_repeats_kv_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from autoplan.bench import micro

    monkeypatch.setattr(micro, "_gqa_in_kernel", lambda *args: False)
    case = micro.AttentionCase(batch=1, heads=4, kv_heads=1, seq=64, head_dim=32, dtype="fp32")
    budget = Budget(warmup=1, min_repeats=3, max_repeats=3, seconds=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = micro.run_micro(micro.MicroPlan((case,), ()), "cpu", budget)
    finally:
        torch.set_num_threads(threads)
    assert [r["op"] for r in rows] == ["sdpa_fwd", "sdpa_bwd"]
    assert all(r["kv_heads"] == 1 and r["seconds"] > 0 and r["repeats"] == 3 for r in rows)


# -- workers that fail or hang --------------------------------------------------------------

def _spec(**changes: Any) -> coll.Spec:
    fields: dict[str, Any] = dict(device_kind="cpu", dtype="fp32", message_bytes=(4096,),
                                  budget=Budget(warmup=1, min_repeats=2, max_repeats=2, seconds=0),
                                  timeout_s=60, threads=1)
    return coll.Spec(**{**fields, **changes})


@pytest.mark.torch
def test_a_failing_worker_is_an_error_in_the_parent() -> None:
    pytest.importorskip("torch")
    from autoplan.bench.timing import BenchError

    with pytest.raises(BenchError, match=r"collectives: rank \d failed: KeyError: 'fp8'"):
        coll.spawn_collectives(_spec(dtype="fp8"), world=2)
    assert not multiprocessing.active_children()


@pytest.mark.torch
def test_workers_past_the_time_limit_are_stopped() -> None:
    pytest.importorskip("torch")
    from autoplan.bench.timing import BenchError

    with pytest.raises(BenchError, match="did not finish within"):
        coll.spawn_collectives(_spec(timeout_s=0.5), world=2)
    assert not multiprocessing.active_children()


@pytest.mark.torch
def test_megatrons_cross_entropy_matches_torchs_on_one_rank() -> None:
    # validate's loss at tp 1 and in --slice is Megatron's in-place fp32 cross-entropy (the
    # memory autoplan predicts), and computes the same loss and gradient as F.cross_entropy
    torch = pytest.importorskip("torch")
    from autoplan.bench.torch_model import make_loss

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 11, (2, 5), generator=gen)
    ours = make_loss(None, 0, 1, 11)(logits, target)
    ours.backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref = torch.nn.functional.cross_entropy(logits.float().flatten(0, -2), target.flatten())
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(grad.float(), logits.grad.float(), rtol=1e-2, atol=1e-4)


def test_validate_predicts_memory_as_torch_runs_sequence_parallelism() -> None:
    # validate's torch model (DTensor, and the --slice stand-ins) keeps each TP GEMM's
    # all-gathered input: it predicts that, whatever the plan's stack keeps
    import dataclasses

    from autoplan.bench.validate import as_torch_runs
    from tests.helpers import make_plan

    sp = make_plan(dp=2, tp=4, sequence_parallel=True)
    assert as_torch_runs(sp).stack == dataclasses.replace(sp.stack, sp_saves_gathered=True)
    for same in (make_plan(dp=2, tp=4), make_plan(dp=8), make_plan(dp=2, tp=4, sequence_parallel=True,
                                                                   stack="torchtitan")):
        assert as_torch_runs(same) is same


def test_validate_on_a_cpu_predicts_at_the_measured_kernels_rates() -> None:
    """A CPU descriptor is fitted on bench's timings of the torch kernels validate runs: the
    stack's GPU-fitted share of the benchmarks' rates and its step overhead do not apply."""
    import dataclasses

    from autoplan.bench.validate import as_torch_runs
    from tests.helpers import make_plan

    plan = make_plan(dp=2, tp=4)
    assert plan.stack.compute_efficiency < 1.0 and plan.stack.step_overhead_s > 0  # megatron-core's fit
    assert as_torch_runs(plan, "cpu").stack == dataclasses.replace(
        plan.stack, compute_efficiency=1.0, step_overhead_s=0.0, grad_accumulation_fusion=False)
    assert as_torch_runs(plan, "cuda") is plan


def test_collective_workers_on_a_cpu_are_pinned_one_block_of_cores_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As validate pins its ranks (``validate._pinning``): rank r to the r-th block."""
    import os

    pinned: list[set[int]] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append(set(cpus)), raising=False)
    coll.pin(1, 2)
    coll.pin(0, 1)
    coll.pin(4, 1)  # past the cores: left alone
    assert pinned == [{2, 3}, {0}]


@pytest.mark.torch
def test_validates_fused_qkv_and_gate_up_read_each_ranks_heads_in_proportion() -> None:
    """One Q/K/V GEMM and one gate/up GEMM a layer (the shapes autoplan prices); a rank's
    block of the fused columns splits heads : kv_heads : kv_heads (and gate : up halves)."""
    import dataclasses

    torch = pytest.importorskip("torch")
    from autoplan.bench import torch_model as tm

    model = resolve_model(str(ROOT / "examples" / "cpu" / "tiny-llama.yaml"))
    for tp in (1, 2):
        local = tm.tp_local_model(dataclasses.replace(model, kv_heads=4), tp)
        block = tm.Block(local)
        d = local.kv_channels
        q, k, v = block.attention.split(torch.zeros(1, 3, block.attention.wqkv.out_features))
        widths = (q.shape[-1], k.shape[-1], v.shape[-1])
        assert widths == (local.heads * d, local.kv_heads * d, local.kv_heads * d)
        assert block.feed_forward.w1.out_features == 2 * local.ffn_hidden
        assert not hasattr(block.attention, "wq") and not hasattr(block.feed_forward, "w3")

