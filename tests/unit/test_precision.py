"""Gradient, master-weight and optimizer-state precision (job.main_grads, job.master_weights,
job.optimizer_states, and a stack's ``states`` where a job leaves them unset): the bytes per
parameter Megatron-LM's distributed optimizer holds with bf16 gradients and the
precision-aware optimizer's bf16 moments, NeMo 1.x's distributed_fused_adam with int16
master remainders or no master, the gradient sync they halve, and the job, plan and stack
files that carry them."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.library import builtin_stack, resolve_stack
from autoplan.descriptors.precision import StatePrecision
from autoplan.errors import InputError
from autoplan.kernels import comm
from autoplan.kernels.memory import BytesPerParam, bytes_per_param
from autoplan.parallel import dp, mesh
from autoplan.plans.file import read_plan
from autoplan.schedules import Schedule
from autoplan.vocab import Axis, Dtype, MasterWeights, Recompute, StateDtype, ZeroStage
from tests.helpers import ROOT, autoplan, make_plan

BF16 = StateDtype.BF16


def test_bytes_per_parameter_by_hand():
    # Megatron-LM docs/distrib_optimizer.md: bf16 training keeps a 2-byte weight, a 4-byte
    # fp32 gradient and 12 bytes of fp32 master weight, m and v
    assert bytes_per_param(Dtype.BF16) == BytesPerParam(2, 4, 12)
    assert bytes_per_param(Dtype.BF16, StatePrecision(main_grads=BF16)) == BytesPerParam(2, 2, 12)
    # the precision-aware optimizer with bf16 moments: fp32 master 4 + m 2 + v 2
    both = StatePrecision(main_grads=BF16, optimizer_states=BF16)
    assert bytes_per_param(Dtype.BF16, both) == BytesPerParam(2, 2, 8)
    assert bytes_per_param(Dtype.FP16, StatePrecision(optimizer_states=BF16)) == BytesPerParam(2, 2, 12)


def _plan(**job):
    plan = make_plan("llama3-8b", gpus=16, global_batch=64, dp=16)
    return dataclasses.replace(plan, job=dataclasses.replace(plan.job, **job))


def test_bf16_states_shrink_memory_as_counted_by_hand():
    fp32, bf16 = evaluate(_plan()), evaluate(_plan(main_grads=BF16, optimizer_states=BF16))
    params = stage_work(_plan())[0].params
    gib = 2**30
    assert fp32.memory.grads - bf16.memory.grads == pytest.approx(params * 2)  # 4 -> 2 bytes
    # zero 1 over dp 16: 12 -> 8 bytes per parameter, sharded
    assert fp32.memory.optimizer - bf16.memory.optimizer == pytest.approx(params * 4 / 16)
    assert bf16.memory.peak < fp32.memory.peak - 10 * gib


def test_bf16_gradients_halve_the_gradient_reduction():
    plan = _plan(main_grads=BF16)
    params = stage_work(plan)[0].params
    groups = mesh.groups(plan)
    reduce_s, _ = dp._sync_seconds(plan.zero, plan.job.dtype, params, 0.0, groups[Axis.DP],
                                   groups[Axis.EDP], plan.states.main_grads)
    assert reduce_s == pytest.approx(comm.reduce_scatter(params * 2, groups[Axis.DP]))
    fp32_s, _ = dp._sync_seconds(plan.zero, plan.job.dtype, params, 0.0, groups[Axis.DP],
                                 groups[Axis.EDP])
    assert fp32_s == pytest.approx(comm.reduce_scatter(params * 4, groups[Axis.DP]))


def test_job_files_carry_the_precision_and_refuse_bf16_gradients_under_fp16():
    plan = _plan(main_grads=BF16, optimizer_states=BF16)
    doc = plan.to_dict()
    assert doc["job"]["main_grads"] == doc["job"]["optimizer_states"] == "bf16"
    assert "main_grads" not in _plan().to_dict()["job"]
    back = read_plan(doc, "p.yaml")
    assert (back.job.main_grads, back.job.optimizer_states) == (BF16, BF16)
    with pytest.raises(InputError, match="p.yaml: job.main_grads"):
        read_plan({**doc, "job": {**doc["job"], "dtype": "fp16"}}, "p.yaml")
    with pytest.raises(InputError, match="p.yaml: job.optimizer_states"):
        read_plan({**doc, "job": {**doc["job"], "optimizer_states": "fp8"}}, "p.yaml")


# --------------------------------------------------------------------------- master weights, stacks

REM, NONE = MasterWeights.REMAINDERS, MasterWeights.NONE
GiB = 2**30


def test_master_weights_take_their_bytes_off_the_fp32_copy_by_hand():
    # apex DistributedFusedAdam StateBucket: an int16 remainder shard instead of an fp32 copy;
    # optim.dtype equal to the model's: no master at all
    assert bytes_per_param(Dtype.BF16, StatePrecision(master_weights=REM)) == BytesPerParam(2, 4, 10)
    recipe = StatePrecision(main_grads=BF16, master_weights=NONE, optimizer_states=BF16)
    assert bytes_per_param(Dtype.BF16, recipe) == BytesPerParam(2, 2, 4)
    # the Adam step: grad 4 + master 2x4 + moments 2x8 + weight write 2 = 30; remainders read and
    # write 2 bytes each and read the bf16 weight they complete; no master: only that read
    assert dp.adam_bytes_moved(StatePrecision()) == 30
    assert dp.adam_bytes_moved(StatePrecision(master_weights=REM)) == 4 + 2 * 2 + 16 + 2 + 2
    assert dp.adam_bytes_moved(recipe) == 2 + 0 + 2 * 4 + 2 + 2


def test_remainders_are_a_sharded_optimizers_of_bf16_weights_elsewhere_an_fp32_copy():
    rem = StatePrecision(master_weights=REM)
    assert rem.effective(Dtype.BF16, ZeroStage.OPTIMIZER) is rem
    assert rem.effective(Dtype.FP8, ZeroStage.OPTIMIZER) is rem  # fp8 GEMMs keep bf16 weights
    assert rem.effective(Dtype.FP16, ZeroStage.OPTIMIZER).master_weights is MasterWeights.FP32
    assert rem.effective(Dtype.BF16, ZeroStage.NONE).master_weights is MasterWeights.FP32
    nemo1 = make_plan(dp=8, stack="nemo-1")
    assert nemo1.states == rem
    assert dataclasses.replace(nemo1, zero=ZeroStage.NONE).states == StatePrecision()


def test_a_job_leaves_its_states_to_the_plans_stack_and_a_plan_file_names_them():
    plan = make_plan(dp=8)
    assert (plan.job.main_grads, plan.job.master_weights, plan.job.optimizer_states) == (None,) * 3
    assert plan.states == StatePrecision()
    assert not {"main_grads", "master_weights", "optimizer_states"} & set(plan.to_dict()["job"])
    nemo1 = dataclasses.replace(plan, stack=builtin_stack("nemo-1"))
    assert nemo1.states == StatePrecision(master_weights=REM)  # the stack's, unset in the job
    doc = nemo1.to_dict()
    assert doc["job"]["master_weights"] == "remainders" and "main_grads" not in doc["job"]
    assert read_plan(doc, "p.yaml").states == nemo1.states
    # a state the job sets is kept over the stack's, and written where leaving it out would
    # read back as the stack's
    fp32 = dataclasses.replace(nemo1, job=dataclasses.replace(plan.job,
                                                              master_weights=MasterWeights.FP32))
    assert fp32.states == StatePrecision()
    assert fp32.to_dict()["job"]["master_weights"] == "fp32"
    assert read_plan(fp32.to_dict(), "p.yaml").states == StatePrecision()


def test_a_plan_file_written_before_states_reads_as_it_did_and_writes_the_same():
    doc = {"autoplan": 1, "model": "llama3-8b", "cluster": {"name": "dgx-h100", "nodes": 1},
           "job": {"global_batch": 64, "seq_len": 4096, "dtype": "bf16", "main_grads": "bf16"},
           "layout": {"dp": 8, "tp": 1, "pp": 1}, "micro_batch": 1, "zero": 1}
    plan = read_plan(doc, "old.yaml")
    assert plan.states == StatePrecision(main_grads=BF16)
    assert plan.to_dict()["job"] == doc["job"]
    # run on another stack (evaluate --stack), what the file left unset is that stack's
    assert dataclasses.replace(plan, stack=builtin_stack("nemo-1")).states == \
        StatePrecision(main_grads=BF16, master_weights=REM)


def test_bad_master_weights_are_refused_naming_the_file_and_field(tmp_path):
    doc = _plan().to_dict()
    with pytest.raises(InputError, match=r"p.yaml: job.master_weights: expected one of fp32 \| "
                                         r"remainders \| none"):
        read_plan({**doc, "job": {**doc["job"], "master_weights": "fp16"}}, "p.yaml")
    with pytest.raises(InputError, match="p.yaml: job.master_weights: int16 remainders complete bf16"):
        read_plan({**doc, "job": {**doc["job"], "dtype": "fp16", "master_weights": "remainders"}},
                  "p.yaml")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**doc, "job": {**doc["job"], "master_weights": "int16"}}))
    result = autoplan("evaluate", path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"autoplan: error: {path}: job.master_weights: expected one of fp32 | remainders | none, "
        "got string 'int16'"]


def test_a_stack_file_says_the_states_its_optimizer_keeps_and_bad_ones_are_refused():
    stack = resolve_stack({"name": "s", "summary": "a recipe", "states": {
        "main_grads": "bf16", "master_weights": "none", "optimizer_states": "bf16"}}, "s.yaml")
    recipe = StatePrecision(main_grads=BF16, master_weights=NONE, optimizer_states=BF16)
    assert stack.states == recipe
    assert resolve_stack({"name": "s", "summary": "x"}, "s.yaml").states == StatePrecision()
    assert resolve_stack(stack.to_dict(), "s.yaml") == stack  # an inline stack round-trips
    with pytest.raises(InputError, match="s.yaml: stack.states.master_weights: expected one of"):
        resolve_stack({"name": "s", "summary": "x", "states": {"master_weights": "fp8"}}, "s.yaml")
    with pytest.raises(InputError, match="s.yaml: stack.states.grads: unknown"):
        resolve_stack({"name": "s", "summary": "x", "states": {"grads": "bf16"}}, "s.yaml")


def test_every_built_in_stack_says_its_states_citing_its_code():
    """Each profiles/stacks file sets all three states and a comment names the file and line
    of its framework's code each was read from."""
    for path in sorted((ROOT / "profiles" / "stacks").glob("*.yaml")):
        text = path.read_text()
        assert re.search(r"^  states: \{main_grads: \w+, master_weights: \w+, optimizer_states: \w+\}$",
                         text, re.M), path.name
        head = text.split("\nstack:")[0]
        for key in ("main_grads", "master_weights", "optimizer_states"):
            assert key in head, (path.name, key)
        assert re.search(r"\.py L\d+", head), path.name


# --------------------------------------------------------------------------- Nemotron-4-340B

def _nemotron(stack: str = "megatron-core", **job):
    plan = make_plan("nemotron-4-340b", gpus=128, global_batch=64, dp=2, tp=8, pp=8, vpp=12,
                     schedule=Schedule.INTERLEAVED, recompute=Recompute.SELECTIVE,
                     sequence_parallel=True, stack=stack)
    return dataclasses.replace(plan, job=dataclasses.replace(plan.job, **job))


def _last_stage_params_by_hand() -> int:
    """Parameters on one rank of the last pipeline stage, from the published architecture
    (Nemotron-4 340B technical report, Table 1; ffn 73728, head_dim 192): 96 layers over pp 8
    are 12 per stage (vpp 12 chunks of one), each split over tp 8, and the untied output
    layer; layer norms left out (a few 10^4 per layer)."""
    h, heads, kv, ffn, vocab, tp = 18432, 96, 8, 73728, 256000, 8
    d = h // heads  # 192
    attention = h * (heads * d + 2 * kv * d) + heads * d * h  # QKV and the projection
    mlp = 2 * h * ffn  # squared ReLU: up and down, no gate
    return 12 * (attention + mlp) // tp + vocab * h // tp


def test_nemotron_4_340b_on_128_h100_fits_under_its_recipes_states_as_counted_by_hand():
    """Issue 50: tp8 pp8 vpp12 dp2 with selective recompute. Megatron-Core's distributed
    optimizer keeps 2 + 4 + 12/dp bytes a parameter and does not fit 80 GiB; NeMo 1.x's
    distributed_fused_adam by default 2 + 4 + 10/dp; the Launcher recipe (grad_sync_dtype
    bf16, dtype bf16: no master) 2 + 2 + 4/dp, and it fits."""
    p = _last_stage_params_by_hand()
    assert p == pytest.approx(5.77e9, rel=1e-3)
    mcore = evaluate(_nemotron())
    dfa = evaluate(_nemotron("nemo-1"))
    recipe = evaluate(_nemotron("nemo-1", main_grads=BF16, master_weights=NONE,
                                optimizer_states=BF16))
    for pred, (grads, optimizer) in ((mcore, (4, 12 / 2)), (dfa, (4, 10 / 2)), (recipe, (2, 4 / 2))):
        m = pred.memory  # the fullest stage: the last (the output layer, the most in flight)
        assert m.weights == pytest.approx(2 * p, rel=1e-3)
        assert m.grads == pytest.approx(grads * p, rel=1e-3)
        assert m.optimizer == pytest.approx(optimizer * p, rel=1e-3)
    assert mcore.memory.weights + mcore.memory.grads + mcore.memory.optimizer == \
        pytest.approx(64.5 * GiB, rel=2e-3)  # 10.7 + 21.5 + 32.2 GiB
    assert recipe.memory.weights + recipe.memory.grads + recipe.memory.optimizer == \
        pytest.approx(32.25 * GiB, rel=2e-3)  # 10.7 + 10.7 + 10.7 GiB
    assert mcore.memory.peak > 80 * GiB and not mcore.feasible
    assert dfa.memory.peak > 80 * GiB  # NeMo 1.x's defaults do not fit either
    assert recipe.memory.peak < 80 * GiB - 10 * GiB and recipe.feasible
    # the activations are the same whatever the states
    assert recipe.memory.activations == mcore.memory.activations


def test_diff_names_the_states_two_plans_keep():
    """``autoplan diff`` shows a change of states, the job's or the stack's default's."""
    from autoplan.commands.diff import plan_changes

    a, b = _plan(), _plan(main_grads=BF16)
    assert [(c.field, c.a, c.b) for c in plan_changes(a, b)] == [("job.main_grads", "fp32", "bf16")]
    nemo1 = dataclasses.replace(a, stack=builtin_stack("nemo-1"))
    assert ("job.master_weights", "fp32", "remainders") in \
        [(c.field, c.a, c.b) for c in plan_changes(a, nemo1)]
