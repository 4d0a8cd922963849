"""Serving models whose layers differ (issue 51): memory per layer kind against hand counts,
decode and prefill per kind, what each engine's prefix cache reuses, the vision encoder's
workload fields, the engines' flags and refusals, and ``serve`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import Model, Vision
from autoplan.descriptors.strict import parse_yaml
from autoplan.errors import InputError
from autoplan.export.serving import export_serving
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Lengths,
    Prefix,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.engine import Engine
from autoplan.serving.evaluate import evaluate_serving
from autoplan.serving.planfile import read_serving_plan
from autoplan.serving.scheduler import KVPool
from autoplan.vocab import Activation, Position
from tests.helpers import autoplan, run_launch_script

H1 = with_gpus(resolve_cluster("dgx-h100"), 1)
BF16 = 2


def qwen3_next_like(blocks: int = 4, vision: Vision | None = None) -> Model:
    """Three Gated DeltaNet layers to one full-attention layer, MoE (Qwen3-Next's shape, small)."""
    return Model(name="qnext-test", layers=4 * blocks, hidden=2048, heads=16, kv_heads=2, head_dim=256,
                 ffn_hidden=5120, vocab=151936, activation=Activation.SWIGLU, position=Position.ROPE,
                 tied_embeddings=False, max_seq_len=262144, experts=64, top_k=8, moe_ffn_hidden=512,
                 shared_experts=1, mixers="GGGA" * blocks, mlps="E" * (4 * blocks), attn_output_gate=True,
                 linear_heads=32, linear_key_heads=16, linear_key_dim=128, linear_value_dim=128,
                 conv_kernel=4, vision=vision)


def gpt_oss_like() -> Model:
    """18 sliding (128 tokens) and 18 full layers alternating, MoE (gpt-oss-120b's shape)."""
    return Model(name="gptoss-test", layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64,
                 ffn_hidden=2880, vocab=201088, activation=Activation.SWIGLU, position=Position.ROPE,
                 tied_embeddings=False, max_seq_len=131072, experts=128, top_k=4, moe_ffn_hidden=2880,
                 mixers="WA" * 18, mlps="E" * 36, sliding_window=128, attention_sinks=True,
                 qkv_bias=True, expert_bias=True, router_bias=True)


def nemotron_h_like() -> Model:
    """Mamba-2 and attention layers apart from MLP-only layers (Nemotron-H's pattern, small)."""
    return Model(name="nemoh-test", layers=24, hidden=2048, heads=16, kv_heads=4, head_dim=128,
                 ffn_hidden=8192, vocab=131072, activation=Activation.RELU2, position=Position.ROPE,
                 tied_embeddings=False, max_seq_len=131072, mixers="M.M.A." * 4, mlps=".-.-.-" * 4,
                 mamba_heads=64, mamba_head_dim=64, ssm_state=128, ssm_groups=8, conv_kernel=4)


def dsa_like() -> Model:
    """DeepSeek sparse attention over MLA (DeepSeek-V3.2's attention, a few small layers)."""
    return Model(name="dsa-test", layers=4, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192,
                 vocab=129280, activation=Activation.SWIGLU, position=Position.ROPE, tied_embeddings=False,
                 max_seq_len=163840, q_lora_rank=512, kv_lora_rank=512, qk_nope_head_dim=128,
                 qk_rope_head_dim=64, v_head_dim=128, mixers="DDDD", index_heads=64, index_head_dim=128,
                 index_topk=2048)


def step_of(model: Model, engine: Engine = Engine.VLLM, version: str | None = None, tp: int = 1,
            cluster=H1) -> StepModel:
    return StepModel(model, cluster, Deployment(replicas=1, tp=tp), engine, version)


# ------------------------------------------------------------------ memory per kind

def test_gpt_oss_keeps_kv_of_its_full_layers_per_token_and_of_its_sliding_layers_up_to_the_window() -> None:
    cache = step_of(gpt_oss_like()).cache
    per_layer = 2 * 8 * 64 * BF16  # K and V of 8 heads of 64
    assert cache.kv_per_token == 18 * per_layer
    assert cache.sliding_per_token == 18 * per_layer and cache.window == 128
    assert cache.state_per_sequence == 0
    assert cache.per_sequence(10_000) == 18 * per_layer * 10_000 + 18 * per_layer * 128
    assert cache.per_sequence(100) == 36 * per_layer * 100  # inside the window: every layer


def test_gemma3_27b_keeps_kv_of_its_10_global_layers_per_token_and_of_its_52_local_ones_up_to_1024() -> None:
    """Five sliding layers (1024 tokens) to one global over 62 layers: 10 global, 52 local."""
    cache = step_of(resolve_model("gemma-3-27b-it")).cache
    per_layer = 2 * 16 * 128 * BF16  # K and V of 16 heads of 128
    assert cache.kv_per_token == 10 * per_layer
    assert cache.sliding_per_token == 52 * per_layer and cache.window == 1024
    assert cache.state_per_sequence == 0
    assert cache.per_sequence(8192) == 10 * per_layer * 8192 + 52 * per_layer * 1024
    assert cache.per_sequence(1000) == 62 * per_layer * 1000  # inside the window: every layer


def test_one_gemma3_image_runs_64_by_64_patches_through_siglip_and_256_tokens_through_its_projector() -> None:
    """An 896-pixel image in patches of 14 is 4096 patches; the projector's 4 x 4 pool
    (Vision.merge) makes the 256 tokens the workload's tokens_per_image counts."""
    step = step_of(resolve_model("gemma-3-27b-it"))
    h, f = 1152, 4304
    block = 4 * h * h + 4 * h + 2 * h * f + f + h + 2 * 2 * h  # biased q, k, v, o, fc1, fc2; 2 LayerNorms
    patches = 64 * 64
    projector = h + h * 5376  # mm_soft_emb_norm, mm_input_projection_weight
    flops = 27 * patches * (2 * block + 4 * patches * h) + 2 * projector * 256
    peak = step.device.peak_bf16_flops * step.attn_eff
    assert step.encoder_seconds(1, 256) == pytest.approx(step._kscale * flops / peak, rel=1e-12)


def test_an_engine_without_windows_keeps_every_token_of_a_sliding_layer() -> None:
    cache = step_of(gpt_oss_like(), version="0.5.0").cache  # vLLM's V0 line
    assert cache.kv_per_token == 36 * 2 * 8 * 64 * BF16 and cache.sliding_per_token == 0


def test_qwen3_next_keeps_kv_of_its_full_layers_and_a_constant_state_per_gated_deltanet_layer() -> None:
    step = step_of(qwen3_next_like())
    cache = step.cache
    assert cache.kv_per_token == 4 * 2 * 2 * 256 * BF16  # 4 full layers, 2 KV heads of 256
    ssm = 32 * 128 * 128 * 4  # 32 value heads of d_k 128 x d_v 128, fp32
    conv = (4 - 1) * (2 * 16 * 128 + 32 * 128) * BF16  # the conv's last 3 inputs of q, k, v
    assert cache.state_per_sequence == 12 * (ssm + conv)
    assert cache.per_sequence(5000) == 12 * (ssm + conv) + 5000 * 4 * 2 * 2 * 256 * BF16


def test_nemotron_h_keeps_its_attention_layers_kv_and_its_mamba_layers_states() -> None:
    cache = step_of(nemotron_h_like()).cache
    assert cache.kv_per_token == 4 * 2 * 4 * 128 * BF16
    ssm = 64 * 64 * 128 * 4  # heads x head width x state, fp32
    conv = 3 * (64 * 64 + 2 * 8 * 128) * BF16  # x, B and C
    assert cache.state_per_sequence == 8 * (ssm + conv)


def test_sparse_attention_keeps_the_mla_latent_and_the_indexers_fp8_key_per_token() -> None:
    cache = step_of(dsa_like()).cache
    latent = (512 + 64) * BF16  # the compressed KV and the shared RoPE key
    index = 128 * 1 + 4  # one fp8 key of 128 channels and its fp32 scale
    assert cache.kv_per_token == 4 * (latent + index) and cache.state_per_sequence == 0


def test_sparse_attention_decodes_the_indexers_keys_of_all_and_the_latent_of_top_k() -> None:
    step = step_of(dsa_like())
    n = 2
    const, slope = step._decode_kinds(n, n * 100_000)  # past index_topk: the latent read is fixed
    assert slope == pytest.approx(4 * step._index_ctx_s)
    assert const == pytest.approx(4 * step._ctx_s["D"] * n * 2048)


def test_tensor_parallel_splits_the_recurrent_states_by_heads() -> None:
    one, two = step_of(qwen3_next_like()).cache, step_of(qwen3_next_like(), tp=2).cache
    assert two.state_per_sequence == pytest.approx(one.state_per_sequence / 2)
    assert two.kv_per_token == one.kv_per_token / 2  # 2 KV heads over 2 GPUs


@pytest.mark.parametrize("make", [qwen3_next_like, gpt_oss_like, nemotron_h_like, dsa_like])
def test_a_hybrid_models_weights_on_one_gpu_are_its_parameters(make) -> None:
    model = make()
    assert step_of(model).memory_weights() == pytest.approx(BF16 * model.params_total, rel=1e-12)


def test_the_sequences_that_fit_are_the_budget_over_state_and_kv_per_token() -> None:
    step = step_of(qwen3_next_like())
    budget = 20 * 1024**3
    units = int(budget // step.pool_unit())
    pool = KVPool(units, reserves=False, per_seq=step.seq_units)
    prompt, admitted = 4000, 0
    while pool.can_admit(prompt, prompt):
        pool.allocate(prompt, prompt)
        admitted += 1
    assert admitted == int(budget // step.cache.per_sequence(prompt))
    pool.free(prompt, prompt)
    assert pool.can_admit(prompt, prompt)  # a finished sequence gives its state back


# ------------------------------------------------------------------ step time per kind

def test_decoding_reads_the_full_layers_whole_context_and_the_sliding_ones_their_window() -> None:
    step = step_of(gpt_oss_like())
    const, slope = step._decode_kinds(4, 4 * 10_000)  # past the window: sliding layers constant
    assert slope == pytest.approx(18 * step._ctx_s["A"] * step.decode_ratio(4, 40_000))
    assert const == pytest.approx(18 * step._ctx_s["W"] * 4 * 128 * step.decode_ratio(4, 40_000))


def test_a_recurrent_layer_decodes_in_the_same_time_at_any_context() -> None:
    step = step_of(qwen3_next_like())
    short, long = step.iteration(8, decodes=8, decode_context=8 * 100, prefill_pairs=0, prefill_context=0,
                                 sampled=8), step.iteration(8, decodes=8, decode_context=8 * 100_000,
                                                            prefill_pairs=0, prefill_context=0, sampled=8)
    only_full = step_of(qwen3_next_like())._decode_kinds(8, 8 * 100)[1]
    assert long.kv_read - short.kv_read == pytest.approx(step._kscale * only_full * 8 * (100_000 - 100))


def test_a_recurrent_prefill_grows_linearly_where_attention_grows_with_the_pairs() -> None:
    step = step_of(qwen3_next_like())
    def core(n: int) -> float:
        return step.iteration(n, decodes=0, decode_context=0.0, prefill_pairs=n * (n + 1) / 2,
                              prefill_context=0.0, sampled=1).attention
    recurrent = sum(c * step._recurrent_s[m] for m, c in step._mixer_counts.items() if m == "G")
    full = step._mixer_counts["A"] * step._pair_s["A"]
    for n in (1000, 8000):
        assert core(n) == pytest.approx(step._kscale * (recurrent * n + full * n * (n + 1) / 2))


# ------------------------------------------------------------------ prefix caching per engine

@pytest.mark.parametrize(("engine", "version", "model", "block"), [
    (Engine.VLLM, "0.11.0", qwen3_next_like, 0),  # prefix caching disabled for hybrid models
    # Mamba-2: a state per state-sized block (2,134,016 bytes over 2,048 a token: 66 x 16)
    (Engine.VLLM, "0.14.0", nemotron_h_like, 1056),
    (Engine.VLLM, "0.14.0", qwen3_next_like, 0),  # GDN's own prefix caching never merged
    (Engine.VLLM, "0.33.0", qwen3_next_like, 7 * 1056),  # align: whole scheduler steps of blocks
    (Engine.SGLANG, None, qwen3_next_like, 0),  # MambaRadixCache no_buffer: no state in a prefix
    (Engine.TRTLLM, "1.2.0", qwen3_next_like, 0),
    (Engine.TRTLLM, "1.3.0", qwen3_next_like, 32),
    (Engine.VLLM, "0.33.0", gpt_oss_like, 16),  # sliding windows: whole KV blocks
])
def test_each_engine_reuses_of_a_hybrid_prefix_what_it_keeps(engine, version, model, block) -> None:
    assert step_of(model(), engine, version).prefix_block == block


def test_vllms_hybrid_block_holds_one_layers_state() -> None:
    # 2,146,304 bytes of state against 2,048 bytes of KV per token of a layer: 66 x 16 tokens
    from autoplan.serving.kinds import state_block_tokens

    assert state_block_tokens(qwen3_next_like(), 1, BF16) == 1056


def _prefix_plan(model: Model, engine: Engine, version: str | None = None) -> ServingPlan:
    w = Workload(Lengths(2000.0), Lengths(8.0), Arrival(ArrivalKind.RATE, rate_rps=2.0), 40,
                 Prefix(0.9, 1))
    return ServingPlan(model, H1, engine, Deployment(replicas=1, tp=1), w, Slo(), version)


def test_a_prefix_shorter_than_vllms_align_step_is_computed_again_for_a_gated_deltanet_model() -> None:
    assert evaluate_serving(_prefix_plan(qwen3_next_like(1), Engine.VLLM)).prefix_hit_share == 0.0
    hit = evaluate_serving(_prefix_plan(qwen3_next_like(1), Engine.TRTLLM, "1.3.0")).prefix_hit_share
    assert hit is not None and hit > 0.5


# ------------------------------------------------------------------ serve end to end

def _model_file(tmp_path: Path, model: Model) -> Path:
    path = tmp_path / f"{model.name}.yaml"
    path.write_text(yaml.safe_dump({"model": model.to_dict()}, sort_keys=False))
    return path


def test_serve_picks_a_deployment_of_a_hybrid_model_file_and_says_what_a_sequence_holds(tmp_path) -> None:
    got = autoplan("serve", "--model", _model_file(tmp_path, qwen3_next_like(2)), "--cluster", "dgx-h100",
                   "--gpus", "2", "--input-len", "1000", "--output-len", "64", "--rate", "4",
                   "--requests", "60", "--format", "json", "--top", "1")
    assert got.returncode == 0, got.stderr
    best = json.loads(got.stdout)["plans"][0]
    pred = best["prediction"]
    assert pred["requests_per_s"] == pytest.approx(4.0, rel=0.1) and pred["meets_slo"]
    assert 0 < pred["ttft_ms"]["mean"] < 1000 and 0 < pred["tpot_ms"]["mean"] < 100
    cache = pred["cache_per_gpu"]
    tp = best["deployment"]["tp"]
    assert cache["kv_bytes_per_token"] == 2 * 2 * 2 * 256 * BF16 / tp
    assert cache["state_bytes_per_sequence"] > 0
    # its Gated DeltaNet layers by vLLM's measured kernels on the H100 (profiles/measured/mixers)
    provenance = pred["evidence"]["provenance"]
    assert provenance["mixers"]["gated delta net"] == "measured"
    assert provenance["mixer_tables"]["gated delta net"]["decode"] == (
        "profiles/measured/mixers/h100-sxm-vllm-0.24.0-gdn-aiconfigurator-0.12.0.csv")


# ------------------------------------------------------------------ images

VISION = Vision(layers=4, hidden=256, heads=4, ffn_hidden=1024, patch_size=14, out_hidden=2048, merge=2)

PLAN = """\
autoplan: 1
kind: serving
model: MODEL
cluster: {name: dgx-h100, gpus: 1}
engine: vllm
deployment: {replicas: 1, tp: 1}
workload: {input_len: 500, output_len: 16, arrival: {rate_rps: 1}, requests: 20WORKLOAD}
"""


def _plan_text(tmp_path: Path, model: Model, workload: str = "") -> str:
    return PLAN.replace("MODEL", str(_model_file(tmp_path, model))).replace("WORKLOAD", workload)


def test_a_multimodal_workload_prefills_its_images_tokens_after_the_encoder(tmp_path) -> None:
    model = qwen3_next_like(1, VISION)
    text = read_serving_plan(parse_yaml(_plan_text(tmp_path, model), "p.yaml"), "p.yaml")
    images = read_serving_plan(parse_yaml(_plan_text(
        tmp_path, model, ", images_per_request: 2, tokens_per_image: 256"), "p.yaml"), "p.yaml")
    assert images.workload.image_tokens == 512 and images.max_model_len == 500 + 512 + 16
    step = StepModel(model, images.cluster, images.deployment, images.engine)
    assert step.encoder_seconds(2, 256) > 0
    slow, fast = evaluate_serving(images), evaluate_serving(text)
    assert slow.ttft_ms.mean > fast.ttft_ms.mean
    assert images.workload.to_dict()["tokens_per_image"] == 256  # written back into the plan


def test_vllms_launch_limits_the_images_a_prompt_carries(tmp_path) -> None:
    plan = read_serving_plan(parse_yaml(_plan_text(
        tmp_path, qwen3_next_like(1, VISION), ", images_per_request: 3, tokens_per_image: 64"), "p.yaml"),
        "p.yaml")
    argv = run_launch_script(export_serving(plan, Engine.VLLM, "p.yaml")["serve-vllm.sh"], tmp_path,
                             ["vllm", "serve"])
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1]) == {"image": 3}


@pytest.mark.parametrize(("workload", "field", "words"), [
    (", images_per_request: 2", "workload.tokens_per_image", "missing"),
    (", tokens_per_image: 64", "workload.images_per_request", "images_per_request >= 1"),
    (", images_per_request: -1, tokens_per_image: 64", "workload.images_per_request", ">= 0"),
    (", images_per_request: two, tokens_per_image: 64", "workload.images_per_request", "integer"),
    (", images_per_request: 1, tokens_per_image: 64", "workload.images_per_request", "vision encoder"),
])
def test_a_plans_bad_image_fields_are_refused_by_name(tmp_path, workload, field, words) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(_plan_text(tmp_path, qwen3_next_like(1), workload))
    got = autoplan("evaluate", path)
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert f"{path}: {field}" in got.stderr and words in got.stderr


def test_a_job_files_images_for_a_model_without_vision_are_refused_by_name(tmp_path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {_model_file(tmp_path, qwen3_next_like(1))}\ncluster: dgx-h100\ngpus: 1\n"
                   "workload: {input_len: 500, output_len: 16, arrival: offline, images_per_request: 1, "
                   "tokens_per_image: 64}\n")
    got = autoplan("serve", job)
    assert got.returncode == 2 and "workload.images_per_request" in got.stderr
    assert "vision encoder" in got.stderr and "Traceback" not in got.stderr


# ------------------------------------------------------------------ flags and refusals

def _launch_plan(model: Model, engine: Engine, version: str | None = None,
                 prefix: bool = False) -> ServingPlan:
    w = Workload(Lengths(1000.0), Lengths(16.0), Arrival(ArrivalKind.RATE, rate_rps=1.0), 20,
                 Prefix(0.5) if prefix else None)
    return ServingPlan(model, H1, engine, Deployment(replicas=1, tp=1), w, Slo(), version)


def test_vllm_keeps_recurrent_states_in_fp32_and_reuses_prefixes_as_predicted(tmp_path) -> None:
    plan = _launch_plan(qwen3_next_like(1), Engine.VLLM, prefix=True)
    argv = run_launch_script(export_serving(plan, Engine.VLLM, "p.yaml")["serve-vllm.sh"], tmp_path,
                             ["vllm", "serve"])
    assert argv[argv.index("--mamba-ssm-cache-dtype") + 1] == "float32"
    assert argv[argv.index("--mamba-cache-mode") + 1] == "align" and "--enable-prefix-caching" in argv


def test_sglang_keeps_recurrent_states_in_fp32(tmp_path) -> None:
    plan = _launch_plan(nemotron_h_like(), Engine.SGLANG)
    script = export_serving(plan, Engine.SGLANG, "p.yaml")["serve-sglang.sh"]
    argv = run_launch_script(script, tmp_path, ["python", "-m", "sglang.launch_server"])
    assert argv[argv.index("--mamba-ssm-dtype") + 1] == "float32"


@pytest.mark.parametrize(("engine", "version"), [(Engine.TRTLLM, None), (Engine.VLLM, "0.10.0"),
                                                 (Engine.SGLANG, "0.4.0")])
def test_an_engine_release_that_cannot_run_gated_deltanet_refuses_it_by_name(engine, version) -> None:
    with pytest.raises(InputError) as info:
        export_serving(_launch_plan(qwen3_next_like(1), engine, version), engine, "p.yaml")
    assert "gated delta net" in str(info.value) and "qnext-test" in str(info.value)


def test_a_plan_for_a_release_that_cannot_run_its_model_is_refused_at_load(tmp_path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(_plan_text(tmp_path, qwen3_next_like(1)).replace("engine: vllm", "engine: trtllm"))
    got = autoplan("evaluate", path)
    assert got.returncode == 2 and "gated delta net" in got.stderr and "1.2.0" in got.stderr


# ------------------------------------------------------------------ the engines' own parsers

def test_vllms_own_parser_reads_the_hybrid_and_multimodal_flags(tmp_path) -> None:
    from tests.unit.test_serving_launch import _parse

    text = _launch_plan(qwen3_next_like(1, VISION), Engine.VLLM, prefix=True)
    plan = ServingPlan(text.model, text.cluster, text.engine, text.deployment,
                       Workload(Lengths(1000.0), Lengths(16.0), Arrival(ArrivalKind.RATE, rate_rps=1.0), 20,
                                Prefix(0.5), 2, 64), text.slo)
    argv = run_launch_script(export_serving(plan, Engine.VLLM, "p.yaml")["serve-vllm.sh"], tmp_path,
                             ["vllm", "serve"])
    (values,) = _parse("vllm", "vllm_serve_args.py", [argv])
    assert values["mamba_ssm_cache_dtype"] == "float32" and values["mamba_cache_mode"] == "align"
    limit = values["limit_mm_per_prompt"]
    assert (json.loads(limit) if isinstance(limit, str) else limit)["image"] == 2


def test_sglangs_own_parser_reads_the_hybrid_and_multimodal_flags(tmp_path) -> None:
    from tests.unit.test_serving_launch import _parse

    text = _launch_plan(nemotron_h_like(), Engine.SGLANG)
    plan = ServingPlan(qwen3_next_like(1, VISION), text.cluster, text.engine, text.deployment,
                       Workload(Lengths(1000.0), Lengths(16.0), Arrival(ArrivalKind.RATE, rate_rps=1.0), 20,
                                None, 1, 64), text.slo)
    script = export_serving(plan, Engine.SGLANG, "p.yaml")["serve-sglang.sh"]
    argv = run_launch_script(script, tmp_path, ["python", "-m", "sglang.launch_server"])
    (values,) = _parse("sglang", "sglang_server_args.py", [argv])
    assert values["mamba_ssm_dtype"] == "float32" and values["enable_multimodal"] is True
