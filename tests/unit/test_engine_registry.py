"""The serving-engine registry (``autoplan/serving/engine.py``): an engine is its cost spec and
its launch spec (``autoplan/export/engines/launch.py``), one file each in the tree.

This file holds both for a toy engine ("toyserve": a small batch limit, a slow host step,
a launch command of its own). Registered here and nowhere else, it is taken by
``autoplan serve --engine``, simulated with its limits and host time, written to and read
from a serving plan file, and exported as a launch script of its own: nothing else in
the tree names it. Registered without a launch, it is served and refused by the exports.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from autoplan import caches
from autoplan.descriptors.hardware import Device
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.export.engines import LaunchSpec, register_launch, unregister_launch
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Deployment, ServingPlan
from autoplan.serving.engine import Engine, EngineDefaults, EngineSpec, register, unregister
from autoplan.shell import Arg
from tests.helpers import autoplan, engine_constants


def defaults(device: Device) -> EngineDefaults:
    return EngineDefaults(max_num_seqs=64, max_batched_tokens=2048, chunked_prefill=True,
                          memory_fraction=0.9)


def args(plan: ServingPlan, step: StepModel) -> list[Arg]:
    return [("--tp", str(plan.deployment.tp)), ("--max-seqs", str(step.max_num_seqs))]


TOY = EngineSpec(name="toyserve", attr="TOYSERVE", doc="A toy engine.", defaults=defaults,
                 host_step_s=5e-3)

SERVE = ("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
         "--input-len", "512", "--output-len", "64", "--rate", "4", "--requests", "100")


@pytest.fixture
def toy() -> Iterator[Engine]:
    engine = register(TOY)
    register_launch(LaunchSpec(engine=engine, command='toyserve "$MODEL"', args=args))
    try:
        yield engine
    finally:
        caches.clear()
        unregister_launch(engine)
        unregister(engine)


@pytest.fixture
def unlaunched() -> Iterator[Engine]:
    """The toy engine with no launch registered: its cost side alone."""
    engine = register(TOY)
    try:
        yield engine
    finally:
        caches.clear()
        unregister(engine)


def test_a_registered_engine_is_looked_up_by_name_and_forgotten_after(toy):
    assert Engine("toyserve") is toy and toy in list(Engine)
    with pytest.raises(ValueError, match="registered already"):
        register(TOY)


def test_after_the_toy_engine_is_gone_the_registry_holds_the_builtins_only():
    assert [e.value for e in Engine] == ["vllm", "sglang", "trtllm"]
    with pytest.raises(ValueError, match="not a serving engine"):
        Engine("toyserve")


def test_its_host_step_and_batch_limit_reach_the_iteration(toy):
    model, cluster = resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-h100"), 8)
    dep = Deployment(replicas=1, tp=1)
    # vLLM with a host time of its own, in series with the GPU's as the toy's (no overlap)
    with engine_constants(Engine.VLLM, host_step_s=2e-3, serial=True):
        mine, vllm = StepModel(model, cluster, dep, toy), StepModel(model, cluster, dep, Engine.VLLM)
        assert mine.max_num_seqs == 64
        step = dict(tokens=100, decodes=100, decode_context=100 * 600.0, prefill_pairs=0.0,
                    prefill_context=0.0, sampled=100)  # a decode iteration of 100 sequences
        assert mine.step_seconds(**step) - vllm.step_seconds(**step) == pytest.approx(5e-3 - 2e-3)


def test_serve_takes_it_and_its_plan_file_reads_back(toy, tmp_path):
    out = tmp_path / "toy.yaml"
    served = autoplan(*SERVE, "--engine", "toyserve", "--out", out, "--format", "json")
    assert served.returncode == 0, served.stderr
    best = json.loads(served.stdout)["plans"][0]
    assert best["engine"] == "toyserve"
    assert best["deployment"]["max_num_seqs"] <= 64
    again = autoplan("evaluate", out, "--format", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["plans"][0]["prediction"] == best["prediction"]


def test_export_writes_its_own_launch_script(toy, tmp_path):
    out = tmp_path / "toy.yaml"
    assert autoplan(*SERVE, "--engine", "toyserve", "--out", out).returncode == 0
    exported = autoplan("export", out, "--to", "toyserve", "-o", tmp_path / "launch.sh")
    assert exported.returncode == 0, exported.stderr
    script = (tmp_path / "launch.sh").read_text()  # one file: written where -o says
    assert 'exec toyserve "$MODEL" --host 0.0.0.0 --port "$PORT"' in script
    assert "--max-seqs" in script
    refused = autoplan("export", out, "--to", "vllm", "-o", tmp_path / "other")
    assert refused.returncode == 2 and "predicted for toyserve" in refused.stderr


def test_a_launch_registered_twice_is_refused(toy):
    with pytest.raises(ValueError, match="registered already"):
        register_launch(LaunchSpec(engine=toy, command="other", args=args))


def test_an_engine_without_a_launch_is_served_and_every_export_refuses_it(unlaunched, tmp_path):
    out = tmp_path / "toy.yaml"
    served = autoplan(*SERVE, "--engine", "toyserve", "--out", out)
    assert served.returncode == 0, served.stderr
    for target in ("toyserve", "k8s", "dynamo", "llm-d"):
        refused = autoplan("export", out, "--to", target, "-o", tmp_path / target)
        assert refused.returncode == 2, (target, refused.stdout)
        assert "autoplan writes no launch of toyserve" in refused.stderr, (target, refused.stderr)
        assert "Traceback" not in refused.stderr
        assert not (tmp_path / target).exists()


def test_an_engines_host_and_kernel_constants_enter_an_iteration_as_stated():
    """Hand calculation: host_seq_s adds its time once per sampled sequence; kernel_scale
    multiplies the kernels' parts (GEMMs, attention, KV reads, logits) and nothing else;
    the closed form of decode runs (decode_coefficients) agrees with step_seconds."""
    import dataclasses

    model, cluster = resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-h100"), 1)
    d = Deployment(replicas=1, tp=1)
    plain = register(TOY)
    try:
        base = StepModel(model, cluster, d, plain)
        slow_spec = dataclasses.replace(TOY, name="toyslow", attr="TOYSLOW", host_seq_s=20e-6,
                                        kernel_scale=1.5)
        slow_engine = register(slow_spec)
        try:
            slow = StepModel(model, cluster, d, slow_engine)
            b0 = base.iteration(300, decodes=44, decode_context=44 * 900.0, prefill_pairs=256 * 257 / 2,
                                prefill_context=0.0, sampled=45)
            b1 = slow.iteration(300, decodes=44, decode_context=44 * 900.0, prefill_pairs=256 * 257 / 2,
                                prefill_context=0.0, sampled=45)
            kernels = ("gemm", "attention", "kv_read", "logits")
            for part in kernels:
                assert getattr(b1, part) == pytest.approx(1.5 * getattr(b0, part), rel=1e-12)
            for part in ("elementwise", "tp_comm", "kernel_gaps"):
                assert getattr(b1, part) == getattr(b0, part)
            assert b1.host - b0.host == pytest.approx(45 * 20e-6, rel=1e-12)
            assert slow.step_seconds(300, decodes=44, decode_context=44 * 900.0, prefill_pairs=256 * 257 / 2,
                                     prefill_context=0.0, sampled=45) == pytest.approx(b1.total)
            a, c = slow.decode_coefficients(44)
            assert a + c * 44 * 900.0 == pytest.approx(slow.step_seconds(44, decodes=44,
                                                                         decode_context=44 * 900.0,
                                                                         prefill_pairs=0.0,
                                                                         prefill_context=0.0, sampled=44))
        finally:
            unregister(slow_engine)
    finally:
        caches.clear()
        unregister(plain)
