"""Today's models in training (issue 51): each layer kind costed by what it computes, the
partitioner seeing the kinds, and the launchers writing or refusing them by name."""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import layer_core, shard_of, stage_work
from autoplan.descriptors.library import resolve_model
from autoplan.descriptors.model import FULL, GDN, MAMBA, MOE, SLIDING, SPARSE
from autoplan.descriptors.space import StageShape
from autoplan.errors import InputError
from autoplan.export import Launcher, Target, export, refusals
from autoplan.export.megatron import hybrid_pattern
from autoplan.kernels import flops, mixers
from autoplan.kernels.compute import layer_times
from autoplan.search.stages import partition_problem, with_best_stages
from autoplan.vocab import ZeroStage
from tests.helpers import autoplan, make_plan
from tests.unit.test_export import flags, megatron_config, run_script, torchrun_args

QWEN_NEXT = resolve_model("qwen3-next-80b-a3b")


# ----------------------------------------------------------------------------- FLOPs

def test_a_causal_query_sees_half_the_sequence_or_its_window() -> None:
    """Mean keys per query, against enumerating min(position, window) over a sequence
    (the closed form drops the enumeration's w/2s, as the full causal count drops 1/2)."""
    s, w = 8192, 128
    enumerated = sum(min(i, w) for i in range(1, s + 1)) / s
    assert mixers.keys_per_query(s, w) == pytest.approx(enumerated - w / (2 * s))
    assert mixers.keys_per_query(s, 0) == s / 2
    assert mixers.keys_per_query(100, 128) == 50  # shorter than the window: full causal


def test_a_sliding_layer_attends_over_its_window_only() -> None:
    gpt_oss = resolve_model("gpt-oss-120b")
    s, w, d, heads = 32768, 128, 64, 64
    assert gpt_oss.sliding_window == w
    hand = 2 * (w - w * w / (2 * s)) * heads * (d + d)
    assert mixers.core_flops_per_token(gpt_oss, SLIDING, s) == pytest.approx(hand)
    assert mixers.core_flops_per_token(gpt_oss, FULL, s) == 2 * (s / 2) * heads * 2 * d
    # the model's FLOPs count what its 18 sliding layers really compute
    full = dataclasses.replace(gpt_oss, mixers="")
    saved = 18 * (mixers.core_flops_per_token(gpt_oss, FULL, s) - hand)
    assert (flops.model_layers_forward_flops_per_token(full, s)
            - flops.model_layers_forward_flops_per_token(gpt_oss, s)) == pytest.approx(saved)


def test_the_gated_delta_rule_core_is_counted_by_hand() -> None:
    """Qwen3-Next's GDN: 32 value heads, d_k = d_v = 128, chunks of 64:
    per head 2C(3 d_k + 2 d_v) + 6 d_k d_v = 81,920 + 98,304 FLOPs a token, whatever the
    sequence length."""
    per_head = 2 * 64 * (3 * 128 + 2 * 128) + 6 * 128 * 128
    assert per_head == 180_224
    for s in (4096, 262_144):
        assert mixers.core_flops_per_token(QWEN_NEXT, GDN, s) == 32 * per_head


def test_mamba2_ssd_core_is_counted_by_hand() -> None:
    """Nemotron-H-56B: 256 heads of 64, state 256, 8 groups, chunks of 128: per group
    2 Q N for C^T B, per head 2 Q P + 4 N P."""
    m = resolve_model("nemotron-h-56b")
    hand = 8 * 2 * 128 * 256 + 256 * (2 * 128 * 64 + 4 * 256 * 64)
    assert mixers.core_flops_per_token(m, MAMBA, 8192) == hand


def test_sparse_attention_scores_every_key_and_attends_to_top_k() -> None:
    """DeepSeek-V3.2 at 128k: the indexer's 64 heads of 128 over every earlier key, MLA's
    128 heads of 192 + 128 over at most 2,048 keys."""
    m = resolve_model("deepseek-v3.2")
    s = 131_072
    index = 2 * (s / 2) * 64 * 128
    attend = 2 * (2048 - 2048 ** 2 / (2 * s)) * 128 * (192 + 128)
    assert mixers.core_flops_per_token(m, SPARSE, s) == pytest.approx(index + attend)
    assert mixers.core_flops_per_token(m, SPARSE, s) < mixers.core_flops_per_token(m, FULL, s) / 4


def test_a_hybrid_layers_gemm_flops_are_its_weights_twice() -> None:
    """A (GDN, MoE) layer of Qwen3-Next: 2 FLOPs per projection weight a token touches
    (in_proj of q, k, v, z and b, a; out_proj; the router, 10 experts and the shared one
    with its gate) plus its scan and conv."""
    m = QWEN_NEXT
    key, value = 16 * 128, 32 * 128
    projections = 2048 * (2 * key + 2 * value + 2 * 32) + value * 2048
    mlp = 512 * 2048 + 10 * 3 * 2048 * 512 + 3 * 2048 * 512 + 2048  # + the shared gate
    core = mixers.core_flops_per_token(m, GDN, 4096) + 2 * (2 * key + value) * 4
    assert flops.kind_forward_flops_per_token(m, (GDN, MOE), 4096) == 2 * (projections + mlp) + core


# ----------------------------------------------------------------------------- stages

def test_a_stages_work_is_its_layers_by_kind() -> None:
    """Two stages of Qwen3-Next's pattern (GGGA x 12): each stage's forward compute is the
    sum of its layers' own times, kind by kind, plus the ends it holds."""
    plan = make_plan(QWEN_NEXT, gpus=64, dp=8, pp=2, ep=8, global_batch=64)
    works = stage_work(plan)
    assert [w.mix for w in works] == [(18, 6), (18, 6)]  # (G, E) and (A, E) layers
    core = layer_core(plan)
    shard = shard_of(plan)
    device = plan.cluster.device
    g = layer_times(QWEN_NEXT, shard, device, kind=(GDN, MOE))
    a = layer_times(QWEN_NEXT, shard, device, kind=(FULL, MOE))
    assert core.kinds[0].forward == pytest.approx(g.forward)
    assert g.attention_forward < a.attention_forward / 4  # the scan against attention
    middle = 18 * g.forward + 6 * a.forward
    assert works[0].compute_f == pytest.approx(middle, rel=1e-9)


def test_the_partitioner_prices_each_layer_by_its_kind() -> None:
    """Linear layers first and full attention last, at 32k tokens: the split the
    partitioner picks gives the stage of cheap linear layers more of them."""
    m = dataclasses.replace(QWEN_NEXT, layers=16, mixers="G" * 8 + "A" * 8)
    plan = make_plan(m, gpus=32, dp=4, pp=2, ep=8, global_batch=64, seq_len=32768, cp=4,
                     stack="megatron-core")
    problem = partition_problem(plan, StageShape.ANY)
    g, a = problem.layer_time[0], problem.layer_time[-1]
    assert g < a / 2  # a GDN layer's scan against 64k-token causal attention
    best = with_best_stages(plan, StageShape.ANY)
    assert best is not None and best.stage_layers[0] > best.stage_layers[1]
    assert evaluate(best).step_time_s < evaluate(plan).step_time_s


# the flagships served on 16 H200s in fp8 (the others on 8 in bf16)
BIG = ("kimi-k2.5", "glm-5", "deepseek-v3.2", "qwen3.5-397b-a17b", "qwen3-vl-235b-a22b",
       "minimax-m2.5")


# a flagship of each layer kind (G, K, M, D, W with global layers, vision): the kinds'
# hand counts are tests/unit/test_serving_hybrid.py's; benchmarks/families.py serves
# every flagship
@pytest.mark.parametrize("name", ("qwen3-next-80b-a3b", "kimi-linear-48b-a3b", "nemotron-h-56b",
                                  "deepseek-v3.2", "gpt-oss-120b", "gemma-4-26b-a4b",
                                  "qwen3-vl-235b-a22b"))
def test_serve_deploys_a_flagship_of_each_new_family(name: str) -> None:
    big = name in BIG
    served = autoplan("serve", "--model", name, "--cluster", "dgx-h200", "--gpus",
                      "16" if big else "8", "--rate", "4", "--input-len", "2048",
                      "--output-len", "256", "--top", "1", "--format", "json",
                      *(("--weights", "fp8") if big else ()))
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["plans"], served.stdout


# one flagship of each layer kind the other tests do not search (README searches
# Nemotron-H; benchmarks/families.py searches every flagship at its scale)
@pytest.mark.parametrize("name", ("kimi-linear-48b-a3b", "nemotron-3-nano-30b-a3b", "gemma-4-26b-a4b"))
def test_search_plans_a_flagship_of_each_layer_kind(name: str) -> None:
    result = autoplan("search", "--model", name, "--cluster", "dgx-h200", "--gpus", "16",
                      "--global-batch", "256", "--seq-len", "4096", "--top", "1",
                      "--format", "json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]["prediction"]
    assert best["feasible"] and 0.1 < best["mfu"] < 0.7


# ----------------------------------------------------------------------------- exports

def _megatron_words(tmp_path: Path, plan) -> tuple[str, dict[str, list[str]]]:
    files = export(plan, Target.MEGATRON, "hybrid", Launcher.MEGATRON)
    commands, _ = run_script(tmp_path, files, "pretrain_megatron.sh")
    (words,) = commands
    run = torchrun_args(words)
    return run.training_script, flags(run.training_script_args)


def test_qwen3_next_exports_to_megatrons_hybrid_model_with_its_stage_split(tmp_path: Path) -> None:
    plan = make_plan(QWEN_NEXT, gpus=64, dp=8, pp=4, ep=8, global_batch=64, stages=(14, 10, 10, 14))
    script, args = _megatron_words(tmp_path, plan)
    assert script.endswith("/pretrain_hybrid.py")
    pattern = args["hybrid_layer_pattern"][0]
    main, mtp = pattern.split("/")
    segments = main.split("|")
    assert [len(s) // 2 for s in segments] == [14, 10, 10, 14]  # two sublayers a layer
    assert main.replace("|", "") == "GEGEGE*E" * 12 and mtp == "*E"
    assert args["num_layers"] == ["96"]
    assert "experimental_attention_variant" not in args  # G builds GDN in the pattern
    assert "pipeline_model_parallel_layout" not in args and "decoder_first_pipeline_num_layers" not in args
    cfg = _config(args)
    assert (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.attention_output_gate) == (32, 128, True)


def test_nemotron_h_pattern_is_read_by_megatron_cores_allocator(tmp_path: Path) -> None:
    """One pipeline stage: the pattern is M, *, - alone, which Megatron-Core 0.16's own
    allocator (megatron/core/ssm/mamba_hybrid_layer_allocation.py) reads back."""
    pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alloc = pytest.importorskip("megatron.core.ssm.mamba_hybrid_layer_allocation")
    m = resolve_model("nemotron-h-56b")
    plan = make_plan(m, gpus=64, dp=8, tp=8, global_batch=64, sequence_parallel=True)
    script, args = _megatron_words(tmp_path, plan)
    pattern = args["hybrid_layer_pattern"][0]
    assert pattern == resolve_pattern_of(m)
    types = alloc.allocate_layers(len(pattern), 0.0, 0.0, pattern)
    assert (types.count("M"), types.count("*"), types.count("-")) == (54, 10, 54)
    assert args["position_embedding_type"] == ["none"]
    assert (args["mamba_num_heads"], args["mamba_state_dim"]) == (["256"], ["256"])
    _config(args)


def resolve_pattern_of(model) -> str:
    """Nemotron-H's hybrid_override_pattern from its config, as published."""
    import json

    path = Path(__file__).resolve().parents[1] / "data" / "hf" / "nvidia--Nemotron-H-56B-Base-8K.config.json"
    return json.loads(path.read_text())["hybrid_override_pattern"]


def test_gpt_oss_exports_its_windows_and_sinks_as_megatron_flags(tmp_path: Path) -> None:
    plan = make_plan("gpt-oss-120b", gpus=64, dp=8, ep=8, global_batch=64)
    script, args = _megatron_words(tmp_path, plan)
    assert script.endswith("/pretrain_gpt.py")
    assert (args["window_size"], args["window_attn_skip_freq"], args["softmax_type"]) == (
        ["128,0"], ["2"], ["learnable"])
    cfg = _config(args)
    assert cfg.window_attn_skip_freq == 2


def _config(args: dict[str, list[str]]):
    """megatron_config of the export's arguments, the hybrid's own arguments aside (the
    pattern goes to HybridModel, not TransformerConfig) and the window read as Megatron-LM's
    tuple_type reads it."""
    args = {k: v for k, v in args.items() if k != "hybrid_layer_pattern"}
    window = args.pop("window_size", None)
    cfg = megatron_config(args)
    if window:
        assert tuple(int(x) for x in window[0].split(",")) == (128, 0)
    return cfg


@pytest.mark.parametrize(("model", "target", "field", "words"), [
    ("kimi-linear-48b-a3b", Target.MEGATRON, "model.mixers", "Kimi Delta Attention"),
    ("gemma-4-26b-a4b", Target.MEGATRON, "model.global_head_dim", "Gemma 4"),
    ("qwen3-next-80b-a3b", Target.NEMO, "model.mixers", "Megatron-Bridge provider"),
    ("nemotron-h-56b", Target.TORCHTITAN, "model.mixers", "torchtitan builds no model"),
])
def test_a_launcher_that_cannot_build_a_family_refuses_it_by_name(model, target, field, words) -> None:
    plan = make_plan(model, gpus=64, dp=64 if "nemotron" in model else 8,
                     ep=1 if "nemotron" in model else 8, global_batch=64)
    problems = refusals(plan, target)
    assert any(f == field and words in why for f, why in problems), problems
    with pytest.raises(InputError, match=field):
        export(plan, target, "x")


@pytest.mark.parametrize(("target", "field", "words"), [
    (Target.MEGATRON, "model.sandwich_norms", "sandwich norms"),
    (Target.MEGATRON, "model.activation", "GeGLU"),
    # 62 layers are not a whole number of five-local-one-global groups: no skip frequency
    (Target.MEGATRON, "model.mixers", "--window-attn-skip-freq"),
    (Target.NEMO, "model.mixers", "Megatron-Bridge provider"),
    (Target.TORCHTITAN, "model.mixers", "torchtitan builds no model"),
])
def test_gemma3_is_refused_by_name_by_each_launcher_that_cannot_build_it(target, field, words) -> None:
    plan = make_plan("gemma-3-27b-it", gpus=16, dp=16, global_batch=64)
    problems = refusals(plan, target)
    assert any(f == field and words in why for f, why in problems), problems
    assert not any("export to megatron" in why for _, why in problems)  # it refuses Gemma 3 too
    with pytest.raises(InputError, match=field):
        export(plan, target, "x")


def test_torchtitan_runs_its_own_qwen3_5_and_gpt_oss() -> None:
    plan = make_plan("gpt-oss-120b", gpus=64, dp=8, ep=8, global_batch=64, stack="torchtitan",
                     zero=ZeroStage.PARAMETERS)
    files = export(plan, Target.TORCHTITAN, "x")
    text = next(iter(files.values()))
    assert 'name = "gpt_oss"' in text and 'flavor = "120b"' in text


def test_the_pattern_marks_each_virtual_stage() -> None:
    plan = make_plan(QWEN_NEXT, gpus=64, dp=8, pp=2, vpp=2, ep=8, global_batch=64)
    assert [len(s) for s in hybrid_pattern(plan).split("/")[0].split("|")] == [24] * 4


def test_search_for_a_launcher_refuses_a_family_it_cannot_build_before_searching() -> None:
    result = autoplan("search", "--model", "kimi-linear-48b-a3b", "--cluster", "dgx-h100",
                      "--gpus", "64", "--global-batch", "256", "--seq-len", "4096",
                      "--launcher", "megatron")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--model: mixers: --launcher megatron cannot run this model" in result.stderr
    assert "Kimi Delta Attention" in result.stderr


def test_explain_shows_each_stages_layers_by_kind(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    found = autoplan("search", "--model", "nemotron-h-56b", "--cluster", "dgx-h100", "--gpus", "64",
                     "--global-batch", "256", "--seq-len", "8192", "--top", "1", "--out", str(out))
    assert found.returncode == 0, found.stderr
    explained = autoplan("explain", str(out))
    assert explained.returncode == 0, explained.stderr
    assert "kinds" in explained.stdout and "M." in explained.stdout and ".-" in explained.stdout


def test_nemotron_3_ultras_latent_experts_export_as_megatron_cores_moe_latent_size(tmp_path: Path) -> None:
    m = resolve_model("nemotron-3-ultra-550b-a55b")
    plan = make_plan(m, cluster="dgx-h200", gpus=512, dp=64, pp=8, ep=64, global_batch=512)
    script, args = _megatron_words(tmp_path, plan)
    assert script.endswith("/pretrain_hybrid.py") and args["moe_latent_size"] == ["2048"]
    assert _config(args).moe_latent_size == 2048
