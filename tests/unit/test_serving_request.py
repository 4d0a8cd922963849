"""The serving request (``autoplan/serving/request.py``): a job file merged with the
options, every option checked at once, the cluster through the one door."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import InputError
from autoplan.serving.deployment import ArrivalKind, Precision
from autoplan.serving.engine import Engine
from autoplan.serving.request import ServeOptions, build_serve_request, check_serve_options

JOB = """\
model: llama3-8b
cluster: dgx-h200
gpus: 8
engine: sglang
workload: {input_len: 512, output_len: 64, arrival: {rate_rps: 2}, requests: 50}
slo: {ttft_ms: 500, tpot_ms: 50}
"""


def _request(tmp_path: Path, **options: object):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    given = ServeOptions(**options)  # type: ignore[arg-type]
    return build_serve_request(job_file, check_serve_options(job_file, given), given), job_file


def test_options_override_the_job_file_each_with_a_note(tmp_path):
    req, job_file = _request(tmp_path, rate=5.0, requests=20, engine="vllm", weights="fp8,bf16")
    assert req.engine is Engine.VLLM
    assert req.workload.arrival.kind is ArrivalKind.RATE and req.workload.arrival.rate_rps == 5.0
    assert req.workload.requests == 20 and req.workload.input_len.mean == 512
    assert req.weights == (Precision.FP8, Precision.BF16)
    assert req.slo.ttft_ms == 500 and req.slo.tpot_ms == 50
    assert req.notes == (f"--requests overrides {job_file}", f"--engine overrides {job_file}",
                         f"--rate/--concurrency/--offline/--trace overrides {job_file}")


def test_the_job_file_alone_is_a_request_and_its_cluster_comes_through_the_door(tmp_path):
    req, _ = _request(tmp_path)
    assert req.engine is Engine.SGLANG and req.notes == ()
    assert req.cluster.gpus == 8
    assert req.cluster.device.correction is not None  # the H200's shipped profile


def test_every_bad_option_is_reported_at_once_naming_its_flag():
    given = ServeOptions(model="llama3-8b", cluster="dgx-h100", input_len=0, output_len=64,
                         rate=2.0, concurrency=4, weights="bf16,nope", percentile=101.0)
    with pytest.raises(InputError) as exc:
        check_serve_options(None, given)
    flags = [p.source for p in exc.value.problems]
    assert flags == ["--input-len", "--percentile", "--rate", "--weights"]


def test_an_unknown_engine_names_the_registered_ones():
    given = ServeOptions(model="llama3-8b", cluster="dgx-h100", gpus=8, input_len=512,
                         output_len=64, rate=2.0, engine="foo")
    with pytest.raises(InputError, match="expected one of vllm, sglang, trtllm, got 'foo'"):
        build_serve_request(None, check_serve_options(None, given), given)


def test_a_bad_job_file_field_is_named_with_its_file(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB.replace("gpus: 8", "gpus: 0").replace("engine: sglang", "engine: foo"))
    with pytest.raises(InputError) as exc:
        check_serve_options(job_file, ServeOptions())
    assert [(p.source, p.field) for p in exc.value.problems] == [(str(job_file), "gpus"),
                                                                 (str(job_file), "engine")]


def test_lengths_past_the_context_blame_the_flag_that_set_them_else_the_file(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB.replace("input_len: 512", "input_len: 8150"))
    with pytest.raises(InputError) as exc:  # the file's lengths alone: the file's workload
        build_serve_request(job_file, check_serve_options(job_file, ServeOptions()), ServeOptions())
    assert [(p.source, p.field) for p in exc.value.problems] == [(str(job_file), "workload")]
    given = ServeOptions(output_len=100)
    with pytest.raises(InputError, match="exceeds llama3-8b's max_seq_len") as exc:
        build_serve_request(job_file, check_serve_options(job_file, given), given)
    assert [(p.source, p.field) for p in exc.value.problems] == [("--output-len", "")]
