"""Serving engines by version (``autoplan/serving/engine.py``, ``versions.py``): release
spellings put in order, release lines resolved, each line's documented overlap and fitted
constants reaching the iteration, plan and job files naming a release, ``serve
--engine-version``, and launch scripts pinning it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan import caches
from autoplan.descriptors.hardware import Device
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.export.engines import launch
from autoplan.export.serving import export_serving
from autoplan.serving.cost import StepModel, iteration_seconds
from autoplan.serving.deployment import Deployment
from autoplan.serving.engine import (
    Engine,
    EngineDefaults,
    EngineSpec,
    EngineVersion,
    Fitted,
    register,
    unregister,
)
from autoplan.serving.versions import VersionError, dynamo_engine_version, parse_version
from tests.helpers import autoplan, engine_constants

H1 = with_gpus(resolve_cluster("dgx-h100"), 1)
L8 = resolve_model("llama3-8b")

# --------------------------------------------------------------------------- spellings


def test_release_spellings_sort_as_pep_440_with_candidates_before_releases_before_posts() -> None:
    ordered = ["0.5.1-rc0.pre1", "0.5.1-rc0", "0.5.1", "0.5.9", "0.8.1.post1", "v0.19.0", "1.1.0-dev.2",
               "1.1.0rc0", "1.2.0rc6", "1.2.0rc6.post2", "1.3.0rc5", "1.3.0", "nightly-dev-20260216-d3bae71e"]
    assert sorted(ordered, key=parse_version) == ordered
    assert parse_version("0.19.0+cu130") == parse_version("0.19.0")  # a local build tag
    assert parse_version("nightly-5b8c30d62b754b57").nightly


@pytest.mark.parametrize("text", ["", "abc", "0.19.0-cu130", "1.0.post1rc2", "x" * 200])
def test_text_that_is_no_release_is_refused_saying_what_a_release_looks_like(text: str) -> None:
    with pytest.raises(VersionError, match="expected a version|cannot follow"):
        parse_version(text)


def test_a_number_where_a_release_belongs_is_refused_with_the_hint_to_quote_it() -> None:
    with pytest.raises(VersionError, match="quote it"):
        parse_version(0.1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=4), st.integers(0, 9), st.integers(0, 9))
def test_a_release_sorts_after_its_candidates_and_before_its_post_releases(nums, rc, post) -> None:
    base = ".".join(map(str, nums))
    assert parse_version(f"{base}rc{rc}") < parse_version(base) < parse_version(f"{base}.post{post}")
    assert parse_version(f"{base}-dev.{rc}") < parse_version(f"{base}rc0")


def test_a_dynamo_runtime_tag_names_the_engine_release_inside_it() -> None:
    # Dynamo's support matrix: 0.8.1.post2 holds TensorRT-LLM 1.2.0rc6.post2, 1.1.0-dev.2 1.3.0rc9
    assert dynamo_engine_version("trtllm", "0.8.1.post2") == "1.2.0rc6.post2"
    assert dynamo_engine_version("trtllm", "1.1.0-dev.2") == "1.3.0rc9"
    assert dynamo_engine_version("trtllm", "0.7.0.post2") == "1.2.0rc3"  # the newest row before it
    assert dynamo_engine_version("sglang", "0.5.1-rc0.pre1") is None  # not published
    assert dynamo_engine_version("vllm", "0.4.0") is None  # before every row


# --------------------------------------------------------------------------- resolution

def test_no_release_gives_the_newest_fitted_line() -> None:
    # a table fitted on its older line only: no release is that line, not the newest
    assert VERSIONED.at(None).version == "1.0" and VERSIONED.at(None).is_fitted
    fit, prior = Fitted(host_step_s=1e-3, source="test"), Fitted(host_step_s=1e-3, source="test", prior=True)
    # none fitted: the newest line with a prior of its own
    assert dataclasses.replace(VERSIONED, fitted={"1.0": prior}).at(None).version == "1.0"
    assert not dataclasses.replace(VERSIONED, fitted={"1.0": prior}).at(None).is_fitted
    # a fitted line before a newer prior
    assert dataclasses.replace(VERSIONED, fitted={"1.0": fit, "2.0": prior}).at(None).version == "1.0"
    assert dataclasses.replace(VERSIONED, fitted={"1.0": fit, "2.0": fit}).at(None).version == "2.0"


def test_the_shipped_default_lines_are_fitted_on_nvidias_measured_runs() -> None:
    """The engine files' FITTED (benchmarks/serving_silicon_fit.py): every vLLM and SGLang
    line and TensorRT-LLM 1.x fitted on NVIDIA's closed loops, each with a front end and a
    launch time; vLLM's and TensorRT-LLM's host time in series with the GPU's work (serial),
    SGLang's hidden by its overlap scheduler as the line documents it; TensorRT-LLM 0.17 keeps
    its v0.5-v0.17 fit."""
    from autoplan.serving.engine import SILICON_FIT

    assert {e.value: e.spec.at(None).version for e in Engine} == {
        "vllm": "0.33.0", "sglang": "0.5.23", "trtllm": "1.0.0rc0"}
    for engine, lines in ((Engine.VLLM, ("0.11.0", "0.14.0", "0.33.0")), (Engine.SGLANG, ("0.4.0", "0.5.23")),
                          (Engine.TRTLLM, ("1.0.0rc0",))):
        for version in lines:
            line = engine.spec.at(version)
            assert line.is_fitted and line.fitted is not None, (engine, version)
            assert line.fitted.source == SILICON_FIT and line.request_s > 0 and line.launch_s > 0
            assert line.fitted.serial is (engine is not Engine.SGLANG)
            hidden = line.hidden_share(Deployment(replicas=1, tp=1))
            assert hidden == (0.0 if line.fitted.serial else line.host_hidden)
            assert line.fitted.serial or hidden > 0
    old = Engine.TRTLLM.spec.at("0.17.0")
    assert old.is_fitted and old.host_step_s == 2.98e-3 and old.request_s == 0.0


@pytest.mark.parametrize("engine,release,line", [
    ("vllm", "0.19.0", "0.14.0"), ("vllm", "0.13.9", "0.11.0"), ("vllm", "0.14.0rc1", "0.11.0"),
    ("vllm", "nightly-5b8c30d62b754b57", "0.33.0"), ("trtllm", "1.2.0rc6.post2", "1.0.0rc0"),
    ("trtllm", "1.0.0rc3", "1.0.0rc0"), ("trtllm", "0.8.1", "0.5.0"), ("sglang", "0.5.9", "0.4.0"),
])
def test_a_release_is_predicted_by_the_newest_line_at_or_before_it(engine, release, line) -> None:
    resolved = Engine(engine).spec.resolve(release)
    assert resolved.line.version == line and resolved.release == release and resolved.note is None


def test_a_release_older_than_every_line_takes_the_oldest_with_a_note() -> None:
    assert Engine.VLLM.spec.resolve("0.8.0").line.version == "0.5.0"  # V0's line
    resolved = Engine.VLLM.spec.resolve("0.4.0")
    assert resolved.line.version == "0.5.0"
    assert "older than the oldest release line" in (resolved.note or "")


def test_a_line_without_a_fit_takes_the_constants_of_the_fitted_line_before_it() -> None:
    fit = Fitted(host_step_s=3e-3, host_seq_s=2e-6, kernel_scale=1.2, launch_s=1e-5, request_s=4e-3,
                 source="a fit")
    newer = EngineVersion(version="3.0", host_hidden=1.0, source="test")
    spec = dataclasses.replace(VERSIONED, versions=(*VERSIONED.versions, newer),
                               fitted={"1.0": fit, "3.0": Fitted(host_step_s=9e-3, source="a later fit")})
    one = spec.at("2.3")  # line 2.0: the fit before it, not the newest
    assert one.version == "2.0" and one.fitted is fit
    assert (one.host_step_s, one.host_seq_s, one.kernel_scale, one.launch_s, one.request_s) == (
        fit.host_step_s, fit.host_seq_s, fit.kernel_scale, fit.launch_s, fit.request_s)
    assert one.fitted_line == "1.0" and not one.is_fitted and spec.at("1.0").is_fitted
    # a line before every fitted one takes the oldest fitted line after it
    later = dataclasses.replace(VERSIONED, fitted={"2.0": fit}).at("1.0")
    assert later.fitted_line == "2.0" and later.host_step_s == 3e-3 and not later.is_fitted
    # the default line's constants (the spec's own fields are not overwritten: STYLE.md 6)
    assert spec.at(None).version == "3.0" and spec.at(None).host_step_s == 9e-3
    assert VERSIONED.with_fitted("1.0", fit).at(None).host_step_s == fit.host_step_s == 3e-3
    assert spec.host_step_s == VERSIONED.host_step_s  # as given


def test_each_line_documents_where_its_behaviour_is_read() -> None:
    for engine in Engine:
        for line in engine.spec.versions:
            assert line.source, (engine, line.version)


# --------------------------------------------------------------------------- the iteration

def _steps(engine: Engine, release: str | None, d: Deployment | None = None) -> StepModel:
    return StepModel(L8, H1, d or Deployment(replicas=1, tp=1), engine, release)


@pytest.fixture
def trtllm_overlapped() -> Iterator[None]:
    """TensorRT-LLM's 0.17 and 1.x lines with the same constants of a test's own (about the
    v0.5-v0.17 fit), not set as the host time shown: the 1.x line's overlap scheduler hides
    them (whatever the shipped FITTED holds)."""
    constants = {"host_step_s": 2.98e-3, "host_seq_s": 1.71e-6, "kernel_scale": 1.019}
    with engine_constants(Engine.TRTLLM, "0.17.0", **constants), \
            engine_constants(Engine.TRTLLM, "1.0.0rc0", **constants):
        yield


def test_tensorrt_llm_1x_hides_its_host_time_behind_the_gpus_work_where_0x_adds_it(trtllm_overlapped) -> None:
    # issue 49: the 2.98 ms fitted on TensorRT-LLM v0.5-v0.17 runs, whose loop was serial,
    # made TensorRT-LLM 1.x (overlap scheduler) ~42% too slow per token
    step = dict(tokens=64, decodes=64, decode_context=64 * 1200.0, prefill_pairs=0.0, prefill_context=0.0,
                sampled=64)  # a decode of 64 sequences
    old, new = _steps(Engine.TRTLLM, "0.17.0"), _steps(Engine.TRTLLM, "1.2.0rc6")
    assert new.line.version == "1.0.0rc0" and new.line.host_step_s == old.line.host_step_s == 2.98e-3
    gpu = new.device_seconds(**step)
    host = new.line.host_step_s + new.line.host_seq_s * 64
    assert old.step_seconds(**step) == pytest.approx(gpu + host, rel=1e-12)
    assert new.step_seconds(**step) == pytest.approx(max(gpu, host), rel=1e-12)
    assert new.step_seconds(**step) < old.step_seconds(**step) - 0.9 * min(gpu, host)


def test_a_decode_run_sums_what_its_iterations_take_one_by_one_across_the_host_bound_crossover(
        trtllm_overlapped) -> None:
    # a small model's batch at a short context is host-bound, until its KV reads outgrow the host
    new = StepModel(resolve_model("gpt-1.7b"), H1, Deployment(replicas=1, tp=1), Engine.TRTLLM, "1.2.0rc6")
    assert new.line.hidden_share(new.deployment) == 1.0  # max(GPU, host): the overlap's crossover
    n, ctx = 16, 100.0
    one_by_one = [new.step_seconds(n, decodes=n, decode_context=n * (ctx + i * new.gain), prefill_pairs=0.0,
                                   prefill_context=0.0, sampled=n) for i in range(4000)]
    host = new.line.host_step_s + new.line.host_seq_s * n
    assert one_by_one[0] == pytest.approx(host) and one_by_one[-1] > host  # it crosses over
    run = new.decode_run(n, n * ctx)
    for j in (1, 2, 10, 500, 4000):
        assert run(j) == pytest.approx(sum(one_by_one[:j]), rel=1e-9)


def test_the_serial_lines_decode_run_is_the_closed_form_it_was() -> None:
    with engine_constants(Engine.VLLM, host_step_s=2e-3, host_seq_s=1e-6, serial=True):
        old = _steps(Engine.VLLM, None)
        assert old.line.hidden_share(old.deployment) == 0.0 and old.line.host_step_s == 2e-3
        a, c = old.decode_coefficients(16)
        run = old.decode_run(16, 16 * 500.0)
    assert run(7) == 7 * a + c * (7 * 16 * 500.0 + 16 * old.gain * 7 * 6 / 2)


def test_vllm_keeps_async_scheduling_off_for_pipeline_parallel_and_ngram_proposals() -> None:
    from autoplan.serving.deployment import SpecMethod, Speculative

    fit = Fitted(host_step_s=2e-3, source="a fit")
    spec = Engine.VLLM.spec
    for version in ("0.11.0", "0.14.0", "0.33.0"):  # a fit of the test's own on every line
        spec = spec.with_fitted(version, fit)
    line = spec.at("0.19.0")
    assert line.version == "0.14.0" and line.fitted is fit
    assert line.hidden_share(Deployment(replicas=1, tp=1)) == 1.0
    assert line.hidden_share(Deployment(replicas=1, tp=1, pp=2)) == 0.0
    ngram = Speculative(SpecMethod.NGRAM, 3, acceptance_length=2.0)
    assert line.hidden_share(Deployment(replicas=1, tp=1, speculative=ngram)) == 0.0
    mtp = Speculative(SpecMethod.MTP, 3, acceptance_length=2.0)
    assert line.hidden_share(Deployment(replicas=1, tp=1, speculative=mtp)) == 1.0
    assert spec.at("0.12.0").hidden_share(Deployment(replicas=1, tp=1)) == 0.0  # before 0.14
    # constants set as the host time shown (serial) are not hidden again
    serial = spec.with_fitted("0.14.0", dataclasses.replace(fit, serial=True))
    assert serial.at("0.19.0").hidden_share(Deployment(replicas=1, tp=1)) == 0.0


def test_the_iteration_is_the_gpu_plus_the_host_time_the_overlap_leaves() -> None:
    assert iteration_seconds(3.0, 2.0, 0.0) == 5.0
    assert iteration_seconds(3.0, 2.0, 1.0) == 3.0
    assert iteration_seconds(1.0, 2.0, 1.0) == 2.0
    assert iteration_seconds(1.0, 2.0, 0.5) == 2.0  # 1 shown + max(1, 1)
    assert iteration_seconds(1.0, 0.0, 0.0, launch_floor_s=4.0) == 4.0


def _defaults(device: Device) -> EngineDefaults:
    return EngineDefaults(64, 2048, True, 0.9)


VERSIONED = EngineSpec(
    name="toyver", attr="TOYVER", doc="A toy engine with release lines.", defaults=_defaults,
    versions=(EngineVersion(version="1.0", host_hidden=0.0, cuda_graphs=False, source="test"),
              EngineVersion(version="2.0", host_hidden=1.0, cuda_graphs=True, graph_max_batch=32,
                            source="test")),
    fitted={"1.0": Fitted(host_step_s=1e-3, launch_s=20e-6, source="test")})


@pytest.fixture
def toyver() -> Iterator[Engine]:
    engine = register(VERSIONED)
    try:
        yield engine
    finally:
        caches.clear()
        unregister(engine)


def test_a_line_without_cuda_graphs_runs_no_faster_than_its_host_launches_its_kernels(toyver) -> None:
    eager, graphs = _steps(toyver, "1.0"), _steps(toyver, "2.0")
    kernels = eager.layers_stage * 14  # serving.cost.KERNELS_PER_LAYER
    decode = dict(tokens=1, decodes=1, decode_context=50.0, prefill_pairs=0.0, prefill_context=0.0,
                  sampled=1)  # one short sequence: far less GPU work than launching
    assert eager.step_seconds(**decode) == pytest.approx(kernels * 20e-6 + 1e-3)
    # 2.0 replays decode batches of up to 32 as graphs, and launches the larger ones
    assert graphs.step_seconds(**decode) == pytest.approx(max(graphs.device_seconds(**decode), 1e-3))
    big = dict(tokens=64, decodes=64, decode_context=64 * 50.0, prefill_pairs=0.0, prefill_context=0.0,
               sampled=64)
    launched = max(graphs.device_seconds(**big), kernels * 20e-6, 1e-3)
    assert graphs.step_seconds(**big) == pytest.approx(launched)


def test_a_versioned_engine_registered_in_a_test_is_served_at_a_release_and_named_in_the_plan(
        toyver, tmp_path) -> None:
    got = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "1",
                   "--input-len", "256", "--output-len", "16", "--concurrency", "4", "--requests", "16",
                   "--engine", "toyver", "--engine-version", "2.3", "--format", "json", "--top", "1",
                   "--out", tmp_path / "p.yaml")
    assert got.returncode == 0, got.stderr
    plan = json.loads(got.stdout)["plans"][0]
    assert plan["engine"] == {"name": "toyver", "version": "2.3"}
    assert plan["prediction"]["evidence"]["engine"]["line"] == "2.0"
    assert "version: '2.3'" in (tmp_path / "p.yaml").read_text()


# --------------------------------------------------------------------------- plan and job files

PLAN = """\
autoplan: 1
kind: serving
model: llama3-8b
cluster: {{name: dgx-h100, gpus: 1}}
engine: {engine}
deployment: {{replicas: 1, tp: 1}}
workload: {{input_len: 256, output_len: 16, arrival: {{concurrency: 4}}, requests: 16}}
"""


def _evaluate(tmp_path, engine: str, *extra: str):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.format(engine=engine))
    return autoplan("evaluate", path, "--format", "json", *extra)


def test_a_plan_naming_a_release_is_predicted_with_its_line_and_written_with_it(tmp_path) -> None:
    got = _evaluate(tmp_path, "{name: trtllm, version: 1.2.0rc6.post2}")
    assert got.returncode == 0, got.stderr
    plan = json.loads(got.stdout)["plans"][0]
    assert plan["engine"] == {"name": "trtllm", "version": "1.2.0rc6.post2"}
    assert plan["prediction"]["evidence"]["engine"]["line"] == "1.0.0rc0"
    old = json.loads(_evaluate(tmp_path, "{name: trtllm, version: 0.17.0}").stdout)["plans"][0]
    assert plan["prediction"]["tpot_ms"]["mean"] < old["prediction"]["tpot_ms"]["mean"]


def test_a_plan_naming_the_engine_alone_stays_as_it_was_and_records_the_release_it_ran(tmp_path) -> None:
    got = _evaluate(tmp_path, "vllm")
    plan = json.loads(got.stdout)["plans"][0]
    assert plan["engine"] == "vllm"
    assert plan["prediction"]["evidence"]["engine"]["release"] == "0.33.0"


@pytest.mark.parametrize("engine,field,words", [
    ("{name: tgi, version: 1.0.0}", "engine.name", "expected one of vllm | sglang | trtllm"),
    ("{name: vllm, version: banana}", "engine.version", "expected a version"),
    ("{name: vllm, version: 0.10}", "engine.version", "quote it"),
    ("{name: vllm, release: 0.19.0}", "engine.release", "unknown field"),
])
def test_a_bad_engine_in_a_plan_exits_2_naming_the_field(tmp_path, engine, field, words) -> None:
    got = _evaluate(tmp_path, engine)
    assert got.returncode == 2 and f"plan.yaml: {field}" in got.stderr and words in got.stderr
    assert "Traceback" not in got.stderr


def test_a_job_file_names_the_release_and_engine_names_another_engine_drop_it(tmp_path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("kind: serving\nmodel: llama3-8b\ncluster: dgx-h100\ngpus: 1\n"
                   "engine: {name: sglang, version: 0.5.9}\n"
                   "workload: {input_len: 256, output_len: 16, arrival: {concurrency: 4}, requests: 16}\n")
    got = autoplan("serve", job, "--format", "json", "--top", "1")
    assert json.loads(got.stdout)["plans"][0]["engine"] == {"name": "sglang", "version": "0.5.9"}
    other = autoplan("serve", job, "--format", "json", "--top", "1", "--engine", "vllm")
    assert json.loads(other.stdout)["plans"][0]["engine"] == "vllm"


def test_a_bad_engine_version_flag_exits_2_in_one_line() -> None:
    got = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "1",
                   "--input-len", "256", "--output-len", "16", "--offline", "--engine-version", "latest!")
    assert got.returncode == 2 and got.stderr.strip().startswith("autoplan: error: --engine-version:")
    assert len(got.stderr.strip().splitlines()) == 1


def test_serve_says_when_the_release_is_older_than_every_line() -> None:
    got = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "1",
                   "--input-len", "256", "--output-len", "16", "--offline", "--requests", "8",
                   "--engine-version", "0.4.2", "--format", "json", "--top", "1")
    assert got.returncode == 0 and "older than the oldest release line" in got.stderr


# --------------------------------------------------------------------------- exports

def _plan(engine: Engine, version: str | None, **dep):
    from autoplan.serving.deployment import Arrival, ArrivalKind, Lengths, ServingPlan, Slo, Workload

    w = Workload(Lengths(256.0), Lengths(16.0), Arrival(ArrivalKind.CONCURRENCY, concurrency=4), 16)
    return ServingPlan(L8, H1, engine, Deployment(**{"replicas": 1, "tp": 1, **dep}), w, Slo(), version)


@pytest.mark.parametrize("engine,version,pin", [
    (Engine.VLLM, "0.19.0", "image vllm/vllm-openai:v0.19.0, or pip install vllm==0.19.0"),
    (Engine.SGLANG, "v0.5.9", "image lmsysorg/sglang:v0.5.9"),
    (Engine.TRTLLM, "1.2.0rc6", "image nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6"),
    (Engine.VLLM, None, "vllm 0.33.0 (the release the plan was predicted for)"),
])
def test_the_launch_script_pins_the_release_the_plan_was_predicted_for(engine, version, pin) -> None:
    script = export_serving(_plan(engine, version), engine, "p.yaml")[launch(engine).script]
    assert pin in script.splitlines()[2]


def test_sglang_before_0_5_23_takes_attention_dp_as_dp_size_with_enable_dp_attention() -> None:
    moe = resolve_model("qwen3-30b-a3b")
    plans = {v: dataclasses.replace(_plan(Engine.SGLANG, v, attention_dp=2, ep=2), model=moe,
                                    cluster=with_gpus(resolve_cluster("dgx-h100"), 2))
             for v in ("0.5.9", "0.5.23")}
    old = export_serving(plans["0.5.9"], Engine.SGLANG, "p.yaml")["serve-sglang.sh"]
    new = export_serving(plans["0.5.23"], Engine.SGLANG, "p.yaml")["serve-sglang.sh"]
    assert "--dp-size 2" in old and "--enable-dp-attention" in old and "--attn-dp-size" not in old
    assert "--attn-dp-size 2" in new and "--enable-dp-attention" not in new


def test_the_fit_benchmark_trials_reach_the_prediction(monkeypatch) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from serving_fit import constants

    step = dict(tokens=8, decodes=8, decode_context=8 * 300.0, prefill_pairs=0.0, prefill_context=0.0,
                sampled=8)
    # the default line's entry as the host time shown (the probes' linear form: constants)
    with engine_constants(Engine.TRTLLM, host_step_s=5e-3, serial=True):
        registered = Engine.TRTLLM.spec
        with constants(Engine.TRTLLM, (0.0, 0.0, 0.0)):
            bare = _steps(Engine.TRTLLM, None).step_seconds(**step)
        with constants(Engine.TRTLLM, (1e-3, 0.0, 0.0)):
            host = _steps(Engine.TRTLLM, None).step_seconds(**step)
        assert host - bare == pytest.approx(1e-3)
        assert Engine.TRTLLM.spec is registered and registered.at(None).host_step_s == 5e-3  # restored


# --------------------------------------------------------------------------- kernels launched

def test_a_layer_launches_its_gemms_and_the_fixed_operators_more_for_moe_and_mla() -> None:
    """kernels_per_layer by hand: a dense GQA layer's 4 GEMMs (QKV, O, up+gate, down) and 10
    fixed operators make the 14 of KERNELS_PER_LAYER; DeepSeek-V3's MoE layer has MLA's 5
    projections, the router and the shared expert's 2 GEMMs (8), the 10, the routed experts'
    6 and MLA's 2 latent norms: 26; its 3 dense layers 5 + 2 + 10 + 2 = 19."""
    from autoplan.serving.cost import KERNELS_PER_LAYER, kernels_per_layer

    dense = _steps(Engine.VLLM, None)
    assert dense._layer_kernels == KERNELS_PER_LAYER == kernels_per_layer(L8, 4, False) == 14
    assert dense._kernels == L8.layers * 14
    ds = resolve_model("deepseek-v3")
    step = StepModel(ds, with_gpus(resolve_cluster("dgx-h100"), 8), Deployment(replicas=1, tp=8), Engine.VLLM)
    assert (step._layer_kernels, step._moe_layer_kernels) == (19, 26)
    assert step._kernels == 3 * 19 + (ds.layers - 3) * 26


def test_an_iteration_not_replayed_as_a_graph_takes_at_least_its_kernels_launch_time() -> None:
    """With a per-kernel launch time fitted, a prefill (run eagerly) takes no less than its
    kernels' launches plus the host step; a decode-only batch within the CUDA graphs does not
    pay them."""
    with engine_constants(Engine.VLLM, "0.14.0", host_step_s=1e-3, launch_s=1e-3, serial=True):
        step = _steps(Engine.VLLM, "0.19.0")
        assert step.line.launch_s == 1e-3
        floor = step._kernels * 1e-3
        prefill = step.step_seconds(64, decodes=0, decode_context=0.0, prefill_pairs=64 * 64 / 2,
                                    prefill_context=0.0, sampled=1)
        assert prefill == pytest.approx(1e-3 + floor)  # launch-bound: 448 ms of launches
        decode = step.step_seconds(8, decodes=8, decode_context=8 * 100.0, prefill_pairs=0.0,
                                   prefill_context=0.0, sampled=8)
        assert decode < 0.1 * floor
