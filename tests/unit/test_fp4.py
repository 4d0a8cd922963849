"""fp4 (NVFP4) as a GEMM precision (issue 49): priced at a device's dense fp4 peak, run by
serving's fp4 weights where the device has it (else fp8 GEMMs, else refused), and never a
training precision: a job file's ``dtype: fp4`` and ``--dtype fp4`` are refused saying so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autoplan.descriptors.job import read_job
from autoplan.descriptors.library import resolve_cluster, resolve_device, resolve_model, with_gpus
from autoplan.descriptors.strict import Fields
from autoplan.errors import AutoplanError, Problem
from autoplan.kernels.compute import gemm_time, wave_efficiency
from autoplan.serving.cost import StepModel, compute_dtype
from autoplan.serving.deployment import Deployment, Precision
from autoplan.serving.engine import Engine
from autoplan.vocab import TRAINING_DTYPES, Dtype
from tests.helpers import autoplan

B200 = resolve_device("b200", "test", "device")
H100 = resolve_device("h100-sxm", "test", "device")
A100 = resolve_device("a100-80gb", "test", "device")


def test_a_compute_bound_fp4_gemm_is_priced_at_the_fp4_peak_twice_fp8s_on_b200s_peaks() -> None:
    """16384^3: 8.8 PFLOP against 1.6 GB moved. At one large-GEMM efficiency for every
    dtype (a device file without gemm_fp4), B200's dense fp4 peak (9,000 TFLOPS), twice its
    fp8 (4,500), makes the GEMM twice as fast, over the same tile waves."""
    dev = dataclasses.replace(B200, gemm_fp4_efficiency=None)
    fp8 = gemm_time(16384, 16384, 16384, dev, Dtype.FP8)
    fp4 = gemm_time(16384, 16384, 16384, dev, Dtype.FP4)
    assert fp8 / fp4 == pytest.approx(2.0, rel=1e-9)
    assert fp4 == pytest.approx(2 * 16384**3 / (9000e12 * 0.78 * wave_efficiency(16384, 16384, 148)),
                                rel=1e-9)


def test_b200s_fp4_gemms_run_at_their_measured_fraction_of_the_fp4_peak() -> None:
    """b200.yaml's gemm_fp4 (0.51: TensorRT-LLM's best nvfp4 GEMM, 4,547 of 9,000 TFLOPS, in
    NVIDIA AIConfigurator 0.12's kernel table) against fp8 at gemm (0.78): a compute-bound
    fp4 GEMM is 9000 x 0.51 / (4500 x 0.78) = 1.31x as fast as fp8, where the kernel table's
    large GEMMs measure a median 1.30x (88 shapes with m, n, k >= 8192), not 2x."""
    fp8 = gemm_time(16384, 16384, 16384, B200, Dtype.FP8)
    fp4 = gemm_time(16384, 16384, 16384, B200, Dtype.FP4)
    assert fp8 / fp4 == pytest.approx(9000 * 0.51 / (4500 * 0.78), rel=1e-9)


def test_fp4_takes_its_own_efficiency_else_fp8s_else_the_16_bit_one() -> None:
    own = dataclasses.replace(B200, gemm_fp4_efficiency=0.4, gemm_fp8_efficiency=0.5)
    assert own.gemm_peak_efficiency(Dtype.FP4) == 0.4 and own.gemm_peak_efficiency(Dtype.FP8) == 0.5
    fp8s = dataclasses.replace(own, gemm_fp4_efficiency=None)
    assert fp8s.gemm_peak_efficiency(Dtype.FP4) == 0.5
    neither = dataclasses.replace(fp8s, gemm_fp8_efficiency=None)
    assert neither.gemm_peak_efficiency(Dtype.FP4) == neither.gemm_efficiency == 0.78


def test_a_device_without_an_fp4_peak_has_no_fp4_gemms() -> None:
    assert B200.supports(Dtype.FP4) and not H100.supports(Dtype.FP4)
    with pytest.raises(AutoplanError, match=r"h100-sxm has no fp4 peak \(peak_tflops.fp4\)"):
        gemm_time(4096, 4096, 4096, H100, Dtype.FP4)


def test_fp4_weights_run_fp4_gemms_where_the_device_has_them_else_fp8_else_16_bit() -> None:
    assert compute_dtype(Precision.FP4, B200) is Dtype.FP4
    assert compute_dtype(Precision.FP4, H100) is Dtype.FP8
    assert compute_dtype(Precision.FP4, A100) is Dtype.BF16
    assert compute_dtype(Precision.FP8, B200) is Dtype.FP8  # fp8 weights stay fp8


def test_an_fp4_prefill_on_b200_runs_fp4_gemms_and_on_h100_fp8_ones() -> None:
    """Llama 3 70B at TP 8, an 8,192-token prompt: compute-bound GEMMs. On B200 fp4 weights
    run fp4 GEMMs (fp8's time over 9000 x 0.51 / (4500 x 0.78)); on H100, which has no fp4
    tensor cores, the same weights run fp8 GEMMs."""
    m = resolve_model("llama3-70b")

    def prefill_gemm(cluster: str, weights: Precision) -> float:
        step = StepModel(m, with_gpus(resolve_cluster(cluster), 8),
                         Deployment(replicas=1, tp=8, weights=weights), Engine.VLLM)
        return step.iteration(8192, decodes=0, decode_context=0.0, prefill_pairs=8192 * 8192 / 2,
                              prefill_context=0.0, sampled=1).gemm

    b200 = prefill_gemm("dgx-b200", Precision.FP8) / prefill_gemm("dgx-b200", Precision.FP4)
    assert b200 == pytest.approx(9000 * 0.51 / (4500 * 0.78), rel=0.01)
    assert prefill_gemm("dgx-h100", Precision.FP4) == prefill_gemm("dgx-h100", Precision.FP8)


def test_a_device_file_reads_and_writes_its_fp4_peak_and_efficiency() -> None:
    spec = {"name": "x", "peak_tflops": {"bf16": 100, "fp8": 200, "fp4": 400}, "mem_GiB": 8,
            "hbm_GBps": 100, "efficiency": {"gemm_fp4": 0.4}}
    dev = resolve_device(spec, "x.yaml", "device")
    assert dev.peak_flops(Dtype.FP4) == 400e12 and dev.to_dict()["peak_tflops"]["fp4"] == 400
    assert dev.gemm_fp4_efficiency == 0.4 and dev.to_dict()["efficiency"]["gemm_fp4"] == 0.4
    assert resolve_device(dev.to_dict(), "again", "device") == dev
    assert "fp4" not in H100.to_dict()["peak_tflops"]


def test_serve_refuses_fp4_weights_on_a_gpu_with_neither_fp4_nor_fp8() -> None:
    r = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-a100", "--gpus", "1",
                 "--input-len", "128", "--output-len", "16", "--rate", "1", "--weights", "fp4")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--weights: a100-80gb has no fp8 support (peak_tflops.fp8) nor fp4 (peak_tflops.fp4) " \
           "for fp4" in r.stderr


# -- not a training precision -------------------------------------------------------------


def test_fp4_is_not_a_training_dtype() -> None:
    assert TRAINING_DTYPES == (Dtype.BF16, Dtype.FP16, Dtype.FP8)
    assert not Dtype.FP4.trains


@pytest.mark.parametrize(("value", "message"), [
    ("fp4", "job.dtype: expected one of bf16 | fp16 | fp8, got fp4: fp4 GEMMs are a serving precision"),
    (Dtype.FP4, "job.dtype: expected one of bf16 | fp16 | fp8, got fp4: fp4 GEMMs are a serving"),
    ("fp5", "job.dtype: expected one of bf16 | fp16 | fp8, got "),
])
def test_a_job_is_refused_fp4_and_offered_only_training_dtypes(value: object, message: str) -> None:
    problems: list[Problem] = []
    job = read_job(Fields({"global_batch": 8, "seq_len": 1024, "dtype": value}, "job.yaml", "job", problems))
    assert job is None and len(problems) == 1 and message in str(problems[0])


def test_a_job_file_in_fp4_exits_2_with_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-b200\njob: {global_batch: 8, seq_len: 1024, dtype: fp4}\n")
    r = autoplan("search", job, "--top", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autoplan: error: {job}: job.dtype: expected one of "
                                                   "bf16 | fp16 | fp8, got fp4"), lines


def test_dtype_fp4_on_the_command_line_says_what_fp4_is_for() -> None:
    r = autoplan("search", "-m", "llama3-8b", "-c", "dgx-b200", "-b", "8", "-s", "1024", "--dtype", "fp4")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert ("autoplan: error: --dtype: expected one of bf16, fp16, fp8, got 'fp4': fp4 GEMMs are a "
            "serving precision (autoplan serve --weights fp4), not a training one") in r.stderr


def test_dtype_takes_any_case_of_a_training_precision() -> None:
    from autoplan.cli.options import training_dtype

    assert training_dtype("FP8") is Dtype.FP8 and training_dtype("bf16") is Dtype.BF16


def test_a_training_plan_built_in_code_with_an_fp4_job_breaks_the_dtype_rule() -> None:
    from autoplan.parallel.rules import plan_problems
    from tests.helpers import make_plan

    plan = make_plan(cluster="dgx-b200", dtype=Dtype.FP4)
    assert ("job.dtype", "fp4 is a serving precision, not a training one") in plan_problems(plan)
    fp8 = make_plan(cluster="dgx-b200", dtype=Dtype.FP8)
    assert not [p for p in plan_problems(fp8) if p[0] == "job.dtype"]
