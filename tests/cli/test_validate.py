"""``autoplan validate``: plans run for real with torch on this machine's CPU cores.

End to end through the command line on the committed CPU example plans (a 2-process dp
plan, a 2-stage pp plan, one rank's slice of the tp plan) with their model made small
(:data:`SMALL`) and one warm-up and one timed step, so the file stays near a minute on a
2-core machine. These tests check the contract (JSON keys, exit code agreeing with the
reported tolerance, numbers that belong to the run) and the refusals; they do not assert
that the measured numbers are within tolerance, which depends on how busy the machine
is (examples/cpu/README.md reports full runs of the examples).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autoplan.bench import validate as v
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.strict import read_yaml
from autoplan.errors import InputError
from autoplan.plans.file import read_plan
from autoplan.schedules import Schedule
from autoplan.units import MiB
from autoplan.vocab import Dtype, ZeroStage
from tests.helpers import autoplan, autoplan_subprocess

pytestmark = pytest.mark.torch  # skipped without torch (tests/conftest.py); imported where used

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "examples" / "cpu"
TWO_CORES = v.Machine(cpus=(0, 1), mem_bytes=16 * 2**30)
QUICK = ("--steps", "1", "--warmup", "1")
# the examples' model, small enough that a step takes a fraction of a second
SMALL = {"name": "tiny-llama-test", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2,
         "ffn_hidden": 704, "vocab": 2048, "activation": "swiglu", "position": "rope",
         "tied_embeddings": False, "max_seq_len": 128}


def validate_run(*args: Any) -> subprocess.CompletedProcess[str]:
    """``autoplan validate ARGS`` in a new process, as a user runs it: it spawns the plan's
    processes and sets torch's threads (the refusals below run in this process)."""
    return autoplan_subprocess("validate", *args, timeout=600)


def validate_here(*args: Any) -> subprocess.CompletedProcess[str]:
    """``autoplan validate ARGS`` in this process (``tests.helpers.autoplan``): the plan's
    processes are spawned and set their torch threads as from a new one (the parent sets
    none, and pins each to cores of its own affinity, which a new process would inherit);
    what is saved is the parent's interpreter and torch's import, 2 to 3 s of CPU a run.
    One end-to-end run stays in a new process (:func:`validate_run`, the slice's)."""
    return autoplan("validate", *args)


def example(name: str) -> Any:
    path = CPU / name
    return read_plan(read_yaml(path), str(path))


def small(name: str, tmp_path: Path) -> Path:
    """The example plan with the small model and sequences of 128 tokens, beside its cluster."""
    doc = read_yaml(CPU / name)
    doc["model"] = SMALL
    doc["cluster"] = str(CPU / doc["cluster"])
    doc["job"] = {**doc["job"], "seq_len": 128}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                     reason="the examples run 2 processes, one per core")


def check_contract(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert {"step_time_s", "peak_memory_gib"} <= set(doc["measured"])
    assert {"step_time_s", "peak_memory_gib"} <= set(doc["predicted"])
    assert {"step_time", "peak_memory"} <= set(doc["tolerance"])
    assert (result.returncode == 0) == doc["within_tolerance"]
    tol = doc["tolerance"]
    assert tol["step_time_within"] == (abs(tol["step_time_ratio"] - 1) <= tol["step_time"])
    gap_gib = abs(doc["measured"]["peak_memory_gib"] - doc["predicted"]["peak_memory_gib"])
    assert tol["peak_memory_within"] == (abs(tol["peak_memory_ratio"] - 1) <= tol["peak_memory"]
                                         or gap_gib <= tol["peak_memory_floor_gib"])
    for side in ("measured", "predicted"):
        assert doc[side]["step_time_s"] > 0 and math.isfinite(doc[side]["step_time_s"])
        assert doc[side]["peak_memory_gib"] > 0
    return doc


# --------------------------------------------------------------------------- end to end

@needs_two_cores
@pytest.mark.slow
def test_a_two_process_data_parallel_plan_runs_and_is_compared(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    doc = check_contract(validate_here(small("plan-dp2.yaml", tmp_path), *QUICK, "--format", "json",
                                       "--runs", runs))
    # the run is appended to the runs log (autoplan/tune/runs.py), as tune appends its trials
    from autoplan.tune.runs import read_runs

    (logged,) = read_runs(runs)
    assert logged.source == "validate" and logged.ok
    assert logged.measured_step_time_s == pytest.approx(doc["measured"]["step_time_s"], rel=1e-5)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["ran"]["mode"] == "distributed" and doc["ran"]["processes"] == 2
    # every rank holds the same fp32 parameters and Adam moments: what FSDP2 keeps under ZeRO-0
    states = [r["state_gib"] for r in doc["ranks"]]
    assert states[0] == states[1]
    assert states[0]["optimizer"] == pytest.approx(2 * states[0]["params"])
    # memory is what the machine's load does not move; this small model is 1/3 fixed overhead
    assert 0.5 < doc["tolerance"]["peak_memory_ratio"] < 2.5


@needs_two_cores
@pytest.mark.slow
def test_a_two_stage_pipeline_plan_runs_each_stage_against_its_own_prediction(tmp_path: Path) -> None:
    doc = check_contract(validate_here(small("plan-pp2.yaml", tmp_path), *QUICK, "--format", "json"))
    stages = {r["stage"]: r for r in doc["ranks"]}
    assert set(stages) == {0, 1}
    per_stage = doc["predicted"]["prediction"]["memory_gib_per_stage"]
    for s, rank in stages.items():
        assert rank["predicted_peak_memory_gib"] == pytest.approx(per_stage[s]["peak"])
        assert 0.5 < rank["peak_memory_gib"] / rank["predicted_peak_memory_gib"] < 2.5


@pytest.mark.slow
def test_one_ranks_slice_runs_on_cpu_and_compares_compute_time(tmp_path: Path) -> None:
    """Also the README's walk-through: `bench --describe FILE` then `validate PLAN --cluster
    FILE` needs no edit of the plan to use the descriptor just fitted."""
    result = validate_run(small("plan-tp2.yaml", tmp_path), "--slice", *QUICK, "--format", "json",
                          "--cluster", CPU / "local-cpu.yaml")
    doc = check_contract(result)
    assert doc["ran"]["descriptor"] == f"the cluster file {CPU / 'local-cpu.yaml'}"
    assert doc["ran"]["mode"] == "slice" and doc["ran"]["time_compared"] == "compute_time_s"
    assert doc["ran"]["processes"] == 1
    widths = doc["ran"]["slice_widths"]
    assert widths["heads"] == SMALL["heads"] // 2 and widths["ffn_hidden"] == SMALL["ffn_hidden"] // 2
    assert widths["kv_heads"] == SMALL["kv_heads"] // 2 and widths["vocab"] == SMALL["vocab"] // 2


def test_the_table_says_what_ran_and_how_it_compares(capsys: pytest.CaptureFixture[str]) -> None:
    """A slice's table (the run itself: ``test_one_ranks_slice_runs_on_cpu_and_compares_compute_time``)."""
    from autoplan.cli.commands.validate import _print_validation
    from autoplan.cost.evaluate import evaluate

    plan = example("plan-tp2.yaml")
    rank = v.RankRun(rank=0, stage=0, step_times_s=(1.0, 1.1), peak_memory_bytes=2**30,
                     predicted_peak_bytes=2**30, state_bytes={}, threads=1)
    result = v.Validation(
        source="plan-tp2.yaml", mode="slice", device="cpu", plan=plan, prediction=evaluate(plan),
        descriptor="the plan's cluster", step_times_s=(1.0, 1.1), measured_peak_bytes=2**30,
        predicted_time_s=1.0, predicted_peak_bytes=2**30, ranks=(rank,), time_tolerance=0.5,
        memory_tolerance=0.25, extra={})
    _print_validation(result)
    out = capsys.readouterr().out
    assert "measured against predicted" in out
    assert "compute time" in out and "peak memory" in out


# --------------------------------------------------------------------------- refusals

def test_a_gpu_cluster_on_cpu_without_a_profile_is_refused_naming_the_plan() -> None:
    result = autoplan("validate", ROOT / "examples" / "plans" / "llama3-70b-256xh100-tp8pp2.yaml",
                      "--slice")
    assert result.returncode == 2
    assert "llama3-70b-256xh100-tp8pp2.yaml: cluster: dgx-h100 is a built-in GPU cluster" in result.stderr
    assert "Traceback" not in result.stderr


def test_cuda_without_a_gpu_is_refused() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    result = autoplan("validate", CPU / "plan-dp2.yaml", "--device", "cuda")
    assert result.returncode == 2
    assert "--device: cuda requested but no CUDA device is available" in result.stderr


def problems(plan: Any, **options: Any) -> dict[str, str]:
    found = v.unsupported(plan, "plan.yaml", v.Options(**options), TWO_CORES)
    return {p.field or p.source: p.message for p in found}


def test_what_torch_cannot_run_here_is_named_by_field() -> None:
    pp2 = example("plan-pp2.yaml")
    assert problems(pp2) == {}
    assert "job.dtype" in problems(dataclasses.replace(
        pp2, job=dataclasses.replace(pp2.job, dtype=Dtype.FP16)))
    assert "zb-h2 has no torch.distributed.pipelining schedule" in problems(
        dataclasses.replace(pp2, schedule=Schedule.ZB_H2))["schedule"]
    assert "zero 2 with pp > 1" in problems(dataclasses.replace(pp2, zero=ZeroStage.GRADIENTS))["zero"]
    too_many = dataclasses.replace(pp2, layout=dataclasses.replace(pp2.layout, dp=2))
    assert "4 processes, but this machine has 2 CPU cores" in problems(too_many)["layout"]
    assert "layout" not in problems(too_many, slice=True)  # one rank's slice runs anywhere
    assert "layout" not in problems(too_many, device="cuda", slice=True)  # validate() implies --slice
    hybrid = dataclasses.replace(pp2.model, layers=4, mixers="MMMA", mamba_heads=8, mamba_head_dim=16,
                                 ssm_state=16, ssm_groups=1, conv_kernel=4)
    assert "linear attention, Mamba" in problems(dataclasses.replace(pp2, model=hybrid))["model.mixers"]
    assert "zero" in problems(dataclasses.replace(pp2, zero=ZeroStage.PARAMETERS), slice=True)
    from autoplan.vocab import Offload
    assert "not built by validate" in problems(pp2.replace(offload=Offload(optimizer=True)))["offload"]


def test_a_profile_taken_with_other_thread_counts_is_refused(tmp_path: Path) -> None:
    from autoplan.measured.profile import format_profile

    rows = [{"kind": "gemm", "op": "matmul", "dtype": "bf16", "m": n, "n": n, "k": n, "repeats": 3,
             "seconds": 2 * n**3 / 3e11, "seconds_p10": 1e-3, "seconds_p90": 1e-3} for n in (256, 512)]
    meta = {"device_kind": "cpu", "device_name": "test", "torch": "x", "date": "x", "command": "x",
            "torch_threads": "2"}
    path = tmp_path / "profile.csv"
    path.write_text(format_profile(meta, rows))
    options = v.Options(profile=path)
    with pytest.raises(InputError, match="header.torch_threads: kernels measured with 2 torch threads"):
        v.machine_descriptor(example("plan-dp2.yaml"), "plan.yaml", options, TWO_CORES)


def test_a_cpu_that_emulates_bf16_is_told_to_fit_a_descriptor_here() -> None:
    plan, options = example("plan-dp2.yaml"), v.Options()
    emulating = dataclasses.replace(TWO_CORES, bf16_native=False)
    notes = v.machine_descriptor(plan, "plan.yaml", options, emulating).notes
    assert notes == (v.EMULATED_BF16,) and "autoplan bench --profile profile.csv --describe" in notes[0]
    for machine in (TWO_CORES, dataclasses.replace(TWO_CORES, bf16_native=True)):  # unknown, native
        assert v.machine_descriptor(plan, "plan.yaml", options, machine).notes == ()
    # a descriptor given with --cluster is taken to be this machine's (the README's walk-through)
    fresh = v.Options(cluster=CPU / "local-cpu.yaml")
    assert v.machine_descriptor(plan, "plan.yaml", fresh, emulating).notes == ()


# --------------------------------------------------------------------------- fitting

def test_a_plan_too_big_for_the_machine_is_made_smaller_and_predicted_as_it_runs() -> None:
    plan = example("plan-pp2.yaml")
    big = dataclasses.replace(plan, model=dataclasses.replace(plan.model, layers=64))
    fitted = v.fit_plan(big, v.Options(max_step_s=5.0), mem_budget=8 * 2**30)
    assert fitted.plan.model.layers < 64 and fitted.plan.model.layers % 2 == 0
    assert fitted.adjustments and "of the model's 64 layers" in fitted.adjustments[0]
    from autoplan.cost.evaluate import evaluate

    assert fitted.prediction == evaluate(fitted.plan)
    assert fitted.prediction.step_time_s <= 5.0
    exact = v.fit_plan(big, v.Options(max_step_s=5.0, fit=False), mem_budget=8 * 2**30)
    assert exact.plan == big and exact.adjustments == ()


def test_a_plan_only_too_slow_runs_fewer_microbatches_of_the_same_shapes() -> None:
    from autoplan.cost.evaluate import evaluate

    plan = example("plan-pp2.yaml")
    budget = 0.9 * evaluate(plan).step_time_s
    fitted = v.fit_plan(plan, v.Options(max_step_s=budget), mem_budget=8 * 2**30)
    assert fitted.plan.model == plan.model and fitted.plan.micro_batch == plan.micro_batch
    assert fitted.plan.num_microbatches == plan.num_microbatches // 2
    assert "microbatches" in fitted.adjustments[0] and "time: predicted" in fitted.adjustments[0]


def test_every_cpu_example_plan_loads_and_is_predicted() -> None:
    from autoplan.cost.evaluate import evaluate

    for path in sorted(CPU.glob("plan-*.yaml")):
        plan = read_plan(read_yaml(path), str(path))
        assert evaluate(plan).feasible, path


# --------------------------------------------------------------------------- failures

def test_a_rank_that_fails_becomes_one_error_with_its_message() -> None:
    spec = {"plan": {"autoplan": 1}, "threads": 1, "cpus": None, "device": "cpu", "warmup": 1,
            "steps": 1, "collective_timeout_s": 10, "slice": False, "stage": None}
    with pytest.raises(v.ValidateError, match=r"rank 0 failed: InputError: .*model"):
        v.spawn(spec, 1, timeout_s=120, threads=1)


def test_a_run_over_its_time_is_stopped(tmp_path: Path) -> None:
    path = small("plan-pp2.yaml", tmp_path)
    plan = read_plan(read_yaml(path), str(path))
    spec = {"plan": v._worker_plan(plan), "threads": 1, "cpus": None, "device": "cpu",
            "warmup": 1, "steps": 1, "collective_timeout_s": 10, "slice": False, "stage": None}
    with pytest.raises(v.ValidateError, match="timed out after 1 s"):
        v.spawn(spec, 2, timeout_s=1.0, threads=1)


def test_the_band_is_a_field_that_json_and_the_table_both_show(capsys: pytest.CaptureFixture[str]) -> None:
    from autoplan.cli.commands.validate import _print_validation
    from autoplan.cost.evaluate import evaluate

    plan = example("plan-pp2.yaml")
    pred = evaluate(plan)
    rank = v.RankRun(rank=0, stage=0, step_times_s=(1.0, 1.2), peak_memory_bytes=2**30,
                     predicted_peak_bytes=2**30, state_bytes={}, threads=1)
    result = v.Validation(
        source="plan-pp2.yaml", mode="distributed", device="cpu", plan=plan, prediction=pred,
        descriptor="the plan's cluster", step_times_s=(1.0, 1.2), measured_peak_bytes=2**30,
        predicted_time_s=1.0, predicted_peak_bytes=2**30, ranks=(rank,), time_tolerance=0.5,
        memory_tolerance=0.25, extra={"others_cpu_share_during_run": 0.0},
        step_time_band_s=(0.9, 1.3))
    ran = result.to_dict()["ran"]
    assert list(ran)[-2:] == ["others_cpu_share_during_run", "predicted_step_time_band_s"]
    assert ran["predicted_step_time_band_s"] == [0.9, 1.3]
    without = dataclasses.replace(result, step_time_band_s=None)
    assert "predicted_step_time_band_s" not in without.to_dict()["ran"]
    _print_validation(result)
    out = capsys.readouterr().out
    assert "trees: 0.900 to 1.300 s (10th to 90th percentile)" in out
    assert "dp=1, tp=1, pp=2, 1f1b" in out and "timed steps 2: 1.000 to 1.200 s" in out


def test_peak_memory_passes_within_the_ratio_or_the_cpu_floor() -> None:
    plan = example("plan-pp2.yaml")
    rank = v.RankRun(rank=0, stage=0, step_times_s=(1.0,), peak_memory_bytes=0.0,
                     predicted_peak_bytes=0.0, state_bytes={}, threads=1)
    base = v.Validation(
        source="p", mode="distributed", device="cpu", plan=plan, prediction=evaluate(plan),
        descriptor="d", step_times_s=(1.0,), measured_peak_bytes=0.0, predicted_time_s=1.0,
        predicted_peak_bytes=100 * MiB, ranks=(rank,), time_tolerance=0.5, memory_tolerance=0.25,
        memory_floor_bytes=v.MEMORY_FLOOR_BYTES["cpu"])

    def within(measured_mib: float, **kw: float) -> bool:
        return dataclasses.replace(base, measured_peak_bytes=measured_mib * MiB, **kw).memory_within

    # 100 MiB predicted: 1.45x passes on the 48 MiB floor, 1.5x does not; without it 1.26x fails
    assert within(145) and within(55) and not within(149) and not within(51)
    assert within(125, memory_floor_bytes=0.0) and not within(126, memory_floor_bytes=0.0)
    # 1 GiB predicted: the ratio governs
    assert within(1280, predicted_peak_bytes=1024 * MiB) and not within(1300, predicted_peak_bytes=1024 * MiB)
    assert v.MEMORY_FLOOR_BYTES["cuda"] == 0.0
    assert base.to_dict()["tolerance"]["peak_memory_floor_gib"] == pytest.approx(48 / 1024)


def test_a_runs_log_takes_distributed_runs_and_is_checked_before_the_run(tmp_path: Path) -> None:
    sliced = autoplan("validate", CPU / "plan-pp2.yaml", "--slice", "--runs", tmp_path / "r.csv")
    assert sliced.returncode == 2 and "--runs" in sliced.stderr and "slice" in sliced.stderr
    device = autoplan("validate", CPU / "plan-pp2.yaml", "--runs", "/dev/zero")
    assert device.returncode == 2 and "/dev/zero" in device.stderr
    assert not list(tmp_path.iterdir())


def test_cluster_and_profile_together_are_refused() -> None:
    result = autoplan("validate", CPU / "plan-pp2.yaml", "--cluster", CPU / "local-cpu.yaml",
                      "--profile", CPU / "profile.csv")
    assert result.returncode == 2 and "--cluster: give --cluster or --profile, not both" in result.stderr
