"""The serving tune loop on the command line (issue 52): `autoplan tune --serving` under the
stand-in engines and benchmark clients of tests/data/standin (a server answering /health as
`vllm serve`, `python -m sglang.launch_server` and `trtllm-serve`; `vllm bench serve`,
`python -m sglang.bench_serving` and `aiperf profile` writing their real result formats),
the serving rows of the runs log, `runs import` of each client's result, `calibrate`
recovering the constants synthetic runs were made with, `serve`/`evaluate --calibration`,
and the refusals (a missing engine, a health timeout, too few runs, a result that matches
no plan)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.helpers import autoplan
from tests.unit.test_tune import alive

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "data" / "standin"
# the constants the synthetic runs are made with: the vLLM line's, scaled
TRUTH = {"host_step_s": 1.5, "kernel_scale": 1.3, "request_s": 2.0}


def standin_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("standin_serving", STANDIN / "standin_serving.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def env(tmp_path):
    return {"PATH": os.pathsep.join((str(STANDIN), str(Path(sys.executable).parent), os.environ["PATH"])),
            "PYTHONPATH": os.pathsep.join((str(STANDIN), str(ROOT), os.environ.get("PYTHONPATH", ""))),
            "STANDIN_PIDS": str(tmp_path / "pids"), "STANDIN_ARGS": str(tmp_path / "args"),
            "STANDIN_HEALTH_DELAY": "0.05", "MODEL": None}


def job(tmp_path: Path, engine: str, arrival: str = "{rate_rps: 4}", requests: int = 12) -> Path:
    path = tmp_path / f"job-{engine}.yaml"
    path.write_text(f"model: llama3-8b\ncluster: dgx-h100\ngpus: 2\nengine: {engine}\n"
                    f"workload: {{input_len: 128, output_len: 16, arrival: {arrival}, "
                    f"requests: {requests}}}\nslo: {{ttft_ms: 300, tpot_ms: 30}}\n")
    return path


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def argvs(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "args").read_text().splitlines()]


@pytest.mark.parametrize(("engine", "client", "flag"), [("sglang", "sglang-bench", "--tp-size"),
                                                         ("trtllm", "aiperf", "--tp_size")])
def test_tune_serving_runs_each_engine_with_its_own_benchmark_client(tmp_path, env, engine, client, flag):
    r = autoplan("tune", "--serving", job(tmp_path, engine), "--checkpoint", "/models/llama-3-8b",
                 "--top", "1", "--runs", tmp_path / "runs.csv", "--workdir", tmp_path / "work",
                 "--format", "json", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    (trial,) = json.loads(r.stdout)["trials"]
    assert trial["status"] == "ok" and trial["client"] == client, trial["reason"]
    # the stand-in client measures 1.1x the replica's prediction (its latencies), from its own file
    assert trial["measured"]["ttft_ms"]["mean"] == pytest.approx(1.1 * trial["predicted"]["ttft_ms"]["mean"])
    assert trial["measured"]["tpot_ms"]["mean"] == pytest.approx(1.1 * trial["predicted"]["tpot_ms"]["mean"])
    server, bench = argvs(tmp_path)
    assert server[0] == engine and "/models/llama-3-8b" in server and flag in server  # the export's flags
    assert "127.0.0.1" in server and bench[0] in ("python", "aiperf")
    if engine == "trtllm":  # its LLM API options file, written beside the run
        options = server[server.index("--extra_llm_api_options") + 1]
        assert Path(options).is_file() and Path(options).parent == Path(trial["folder"])
    (row,) = rows(tmp_path / "runs.csv")
    assert (row["kind"], row["engine"], row["client"], row["status"]) == ("serving", engine, client, "ok")
    measured = trial["measured"]["ttft_ms"]["mean"]
    assert float(row["measured_ttft_mean_ms"]) == pytest.approx(measured, rel=1e-5)
    replicas = trial["plan"]["deployment"]["replicas"]
    assert row["replicas"] == str(replicas) and row["gpu"] == "h100-sxm"
    assert row["arrival"] == f"rate {4 // replicas}" and row["deployment"].startswith(f"{replicas}x tp")
    assert not alive(tmp_path / "pids")  # the server, its worker and the client: every one ended


def test_tune_serving_ranks_by_measured_goodput_and_logs_every_trial(tmp_path, env):
    # a tp-2 deployment measures 3x its prediction: searched first, measured last
    runs, best = tmp_path / "runs.csv", tmp_path / "best.yaml"
    r = autoplan("tune", "--serving", job(tmp_path, "vllm"), "--top", "3", "--runs", runs, "--out", best,
                 "--format", "json", cwd=tmp_path, env={**env, "MODEL": "/models/llama-3-8b",
                                                        "STANDIN_TP_FACTORS": "2:3"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    trials = doc["trials"]
    assert [t["status"] for t in trials] == ["ok"] * 3 and doc["best"] == 0
    goodput = [t["measured"]["deployment_goodput_rps"] for t in trials]
    assert goodput == sorted(goodput, reverse=True)  # ranked by what was measured
    assert trials[-1]["plan"]["deployment"]["tp"] == 2 and trials[-1]["searched_rank"] == 1
    # a replica of 2x tp1 runs half the rate and half the requests; its goodput is the deployment's / 2
    two = next(t for t in trials if t["plan"]["deployment"]["replicas"] == 2)
    assert two["replica"]["load"]["rate_rps"] == 2 and two["replica"]["load"]["requests"] == 6
    assert two["measured"]["deployment_goodput_rps"] == pytest.approx(2 * two["measured"]["goodput_rps"])
    logged = rows(runs)
    assert [x["kind"] for x in logged] == ["serving"] * 3 and {x["client"] for x in logged} == {"vllm-bench"}
    assert sorted(x["replicas"] for x in logged) == ["1", "1", "2"]
    assert all(float(x["predicted_tpot_mean_ms"]) > 0 and x["release"] for x in logged)
    written = yaml.safe_load(best.read_text())
    assert written["measured"]["client"] == "vllm-bench" and written["deployment"]["tp"] == 1
    assert autoplan("evaluate", best, cwd=tmp_path).returncode == 0  # the plan reads as a plan
    # the training readers pass the serving rows by: no training run in this log
    r = autoplan("check", ROOT / "examples" / "runs" / "tiny-llama-best.yaml", "--runs", runs, cwd=tmp_path)
    assert "Traceback" not in r.stderr
    assert not alive(tmp_path / "pids")


def test_a_missing_engine_or_client_is_refused_before_any_trial(tmp_path, env):
    bare = {**env, "PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT)}
    r = autoplan("tune", "--serving", job(tmp_path, "vllm"), "--checkpoint", "m", cwd=tmp_path, env=bare)
    assert r.returncode == 2 and "--runner" in r.stderr and "vllm: not found on PATH" in r.stderr, r.stderr
    assert "pip install vllm==" in r.stderr and "Traceback" not in r.stderr
    r = autoplan("tune", "--serving", job(tmp_path, "sglang"), "--checkpoint", "m", cwd=tmp_path, env=bare)
    assert r.returncode == 2 and "no module sglang.launch_server" in r.stderr, r.stderr
    assert not (tmp_path / "autoplan-tune").exists() and not (tmp_path / "autoplan-runs.csv").exists()
    r = autoplan("tune", "--serving", job(tmp_path, "vllm"), cwd=tmp_path, env=env)  # no MODEL either
    assert r.returncode == 2 and "--checkpoint: missing" in r.stderr
    r = autoplan("tune", "--serving", job(tmp_path, "vllm"), "--runner", "torchrun", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "--runner" in r.stderr
    r = autoplan("tune", "--serving", job(tmp_path, "vllm", arrival="{trace: x.csv}"), "--checkpoint", "m",
                 cwd=tmp_path, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_a_health_timeout_fails_the_run_and_ends_the_engines_process_group(tmp_path, env):
    r = autoplan("tune", "--serving", job(tmp_path, "vllm"), "--checkpoint", "m", "--top", "1",
                 "--health-timeout", "0.3", "--runs", tmp_path / "runs.csv", "--format", "json",
                 cwd=tmp_path, env={**env, "STANDIN_MODE": "hang"})
    assert r.returncode == 1, r.stderr
    (trial,) = json.loads(r.stdout)["trials"]
    assert trial["status"] == "failed" and trial["reason"].startswith("health timeout"), trial["reason"]
    assert "--health-timeout" in trial["reason"]
    (row,) = rows(tmp_path / "runs.csv")
    assert row["status"] == "failed" and row["measured_ttft_mean_ms"] == ""
    assert len((tmp_path / "pids").read_text().split()) == 2  # the server and its worker, both ended
    assert not alive(tmp_path / "pids")


def test_an_interrupted_trial_ends_its_engine_before_the_interrupt_goes_on(tmp_path, env, monkeypatch):
    from autoplan.tune.serving_runs import Predicted
    from autoplan.tune.serving_tune import LocalServingRunner, ServingTrial

    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("STANDIN_MODE", "hang")
    plan = _plans()[0]
    pids = tmp_path / "pids"

    def interrupted(port: int) -> bool:  # a Ctrl-C once the engine and its worker run
        if pids.exists() and len(pids.read_text().split()) == 2:
            raise KeyboardInterrupt
        return False

    monkeypatch.setattr("autoplan.tune.serving_tune.healthy", interrupted)
    pred = Predicted.of(_evaluate(plan))
    with pytest.raises(KeyboardInterrupt):
        LocalServingRunner().run(plan, plan, 1, pred, ServingTrial(checkpoint="m", workdir=tmp_path / "t"),
                                 lambda _: None)
    assert len(pids.read_text().split()) == 2 and not alive(pids)


# ---------------------------------------------------------------- runs import and calibrate

def _evaluate(plan):
    from autoplan.serving.evaluate import evaluate_serving

    return evaluate_serving(plan)


def serving_document(plan, pred):
    from autoplan.serving.evaluate import serving_document as document

    return json.loads(json.dumps(document(plan, pred)))


def _plans():
    """Replicas of llama3-8b on H100s whose runs vary what each constant moves: TP 1 and 2
    (the kernels' share), a rate and closed loops of 1 and 16 (the batch), prompts of 128 to
    1024 tokens (eager prefills, the front end)."""
    from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
    from autoplan.serving.deployment import (
        Arrival,
        ArrivalKind,
        Deployment,
        Lengths,
        ServingPlan,
        Slo,
        Workload,
    )
    from autoplan.serving.engine import Engine
    from autoplan.serving.planfile import read_serving_plan
    from autoplan.tune.serving_runs import plan_text

    out = []
    for tp in (1, 2):
        for arrival, prompt in ((Arrival(ArrivalKind.RATE, rate_rps=2.0), 128),
                                (Arrival(ArrivalKind.CONCURRENCY, concurrency=16), 512),
                                (Arrival(ArrivalKind.CONCURRENCY, concurrency=1), 1024)):
            plan = ServingPlan(resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-h100"), tp),
                               Engine.VLLM, Deployment(replicas=1, tp=tp),
                               Workload(Lengths(prompt), Lengths(32), arrival, 16), Slo(500, 50))
            out.append(read_serving_plan(json.loads(plan_text(plan)), "test"))
    return out


CLIENT_ORDER = ("vllm-bench", "sglang-bench", "aiperf")


def write_runs(folder: Path, plans, scale=TRUTH, sidecars: bool = True) -> list[Path]:
    """Each plan's run as a client's result file (the clients in turn) with its trial's
    sidecar, the numbers the stand-ins' truth gives (constants scaled by ``scale``)."""
    from autoplan.tune.serving_clients import CLIENTS
    from autoplan.tune.serving_runs import Predicted, load_of, plan_text
    from autoplan.tune.serving_tune import SIDECAR, sidecar

    ss = standin_module()
    out = []
    for i, plan in enumerate(plans):
        client = CLIENTS[CLIENT_ORDER[i % 3]]
        trial = folder / f"trial-{i}"
        trial.mkdir(parents=True)
        if sidecars:
            predicted = Predicted.of(_evaluate(plan))
            (trial / SIDECAR).write_text(json.dumps(sidecar(plan, plan, 1, "m", client, predicted, [], [])))
        n = ss.truth(json.loads(plan_text(plan)), scale)
        load = load_of(plan)
        rate = "inf" if load.rate_rps is None else f"{load.rate_rps:.6g}"
        if client.name == "vllm-bench":
            doc = ss.vllm_result(n, rate, load.concurrency, load.requests, True)
        elif client.name == "sglang-bench":
            doc = ss.sglang_result(n, rate, load.concurrency, load.input_len, load.output_len)
        else:
            doc = ss.aiperf_result(n, load.rate_rps, load.concurrency, load.requests, load.input_len,
                                   load.output_len, True)
        path = trial / client.result
        path.write_text(json.dumps(doc) + "\n")
        out.append(path)
    return out


def test_runs_import_reads_each_clients_result_and_calibrate_recovers_the_constants(tmp_path):
    results = write_runs(tmp_path, _plans())
    runs = tmp_path / "runs.csv"
    r = autoplan("runs", "import", *results, "--runs", runs)
    assert r.returncode == 0, r.stderr
    logged = rows(runs)
    assert [x["client"] for x in logged] == list(CLIENT_ORDER) * 2
    assert {x["source"] for x in logged} == {"import"}
    assert all(x["kind"] == "serving" and float(x["measured_tpot_mean_ms"]) > 0 for x in logged)
    cal = tmp_path / "vllm-calibrated.yaml"
    r = autoplan("calibrate", runs, "--out", cal, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    base, found = doc["base"], doc["constants"]
    assert (doc["engine"], doc["runs"]) == ("vllm", 6)
    for name, factor in TRUTH.items():  # the synthetic runs' constants, recovered
        assert found[name] == pytest.approx(base[name] * factor, rel=0.02), (name, found, base)
    assert found["launch_s"] == pytest.approx(base["launch_s"], rel=0.02)
    held = doc["held_out"]
    assert held["ttft_mape_before"] > 5 and held["tpot_mape_before"] > 5  # the line's own constants are off
    assert held["ttft_mape_after"] < 1 and held["tpot_mape_after"] < 1  # each run held out, predicted
    # the file the serving side reads: serve and evaluate predict that line with it, and say so
    written = yaml.safe_load(cal.read_text())["serving_calibration"]
    assert written["engine"] == "vllm" and written["line"] == _plans()[0].engine_line.version
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(serving_document(_plans()[0], None)))
    plain = json.loads(autoplan("evaluate", plan, "--format", "json").stdout)["plans"][0]
    r = autoplan("evaluate", plan, "--calibration", cal, "--format", "json")
    assert r.returncode == 0, r.stderr
    calibrated = json.loads(r.stdout)["plans"][0]["prediction"]
    assert calibrated["evidence"]["engine"]["constants"] == "calibrated"
    assert "6 serving runs" in calibrated["evidence"]["engine"]["source"]
    assert calibrated["tpot_ms"]["mean"] > plain["prediction"]["tpot_ms"]["mean"]
    serve = ("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "1", "--input-len", "128",
             "--output-len", "16", "--rate", "2", "--requests", "12")
    r = autoplan(*serve, "--calibration", cal)
    assert r.returncode == 0, r.stderr
    assert "constants calibrated on 6 serving runs" in " ".join(r.stdout.split())
    # another engine's plans: refused, naming the flag
    r = autoplan(*serve, "--engine", "sglang", "--calibration", cal)
    assert r.returncode == 2 and "--calibration" in r.stderr and "not sglang" in r.stderr
    # a day's traffic is planned with them too (--traffic once left --calibration unread)
    day = tmp_path / "day.csv"
    day.write_text("start,rate_rps\n00:00,1\n12:00,2\n")
    traffic = (*serve[:7], "--input-len", "128", "--output-len", "16", "--traffic", day, "--format", "json")
    r = autoplan(*traffic, "--calibration", cal)
    assert r.returncode in (0, 1), r.stderr
    shape = json.loads(r.stdout)["plans"][0]["prediction"]["evidence"]["engine"]
    assert shape["constants"] == "calibrated" and "6 serving runs" in shape["source"]


def test_calibrate_refuses_what_the_runs_cannot_identify(tmp_path):
    plans = _plans()
    runs = tmp_path / "runs.csv"
    # two runs: too few to fit on and hold one out
    two = write_runs(tmp_path / "two", plans[:2])
    assert autoplan("runs", "import", *two, "--runs", runs).returncode == 0
    r = autoplan("calibrate", runs)
    assert r.returncode == 2 and "2 measured serving runs" in r.stderr and "at least 3" in r.stderr
    # rate-driven runs only, of one batch: host_seq_s moves them as host_step_s does
    from autoplan.serving.deployment import Arrival, ArrivalKind

    rated = [p for p in plans if p.workload.arrival.kind is ArrivalKind.RATE]
    more = [type(p)(p.model, p.cluster, p.engine, p.deployment,
                    type(p.workload)(p.workload.input_len, p.workload.output_len,
                                     Arrival(ArrivalKind.RATE, rate_rps=1.0), 16), p.slo) for p in rated]
    log = tmp_path / "rated.csv"
    results = write_runs(tmp_path / "rated", rated + more)
    assert autoplan("runs", "import", *results, "--runs", log).returncode == 0
    r = autoplan("calibrate", log, "--engine", "vllm", "--format", "json")
    assert r.returncode == 0, r.stderr
    why = json.loads(r.stdout)["not_fitted"]
    assert "host_seq_s" in why and "batch sizes" in why["host_seq_s"], why
    # an engine with no run
    r = autoplan("calibrate", log, "--engine", "sglang")
    assert r.returncode == 2 and "no measured serving run of sglang" in r.stderr


def test_runs_import_refuses_a_result_it_cannot_match_to_a_plan(tmp_path):
    plans = _plans()[:1]
    (result,) = write_runs(tmp_path, plans, sidecars=False)
    runs = tmp_path / "runs.csv"
    r = autoplan("runs", "import", result, "--runs", runs)
    assert r.returncode == 2 and str(result) in r.stderr and "--plan" in r.stderr
    # --plan names another rate than the client ran: refused, naming the file and field
    doc = serving_document(plans[0], None)
    doc["workload"]["arrival"] = {"rate_rps": 5.0}
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(doc))
    r = autoplan("runs", "import", result, "--plan", other, "--runs", runs)
    assert r.returncode == 2 and f"{result}: request_rate: ran 2 requests/s, the plan 5" in r.stderr, r.stderr
    # the plan it ran: taken
    doc["workload"]["arrival"] = {"rate_rps": 2.0}
    other.write_text(yaml.safe_dump(doc))
    r = autoplan("runs", "import", result, "--plan", other, "--runs", runs)
    assert r.returncode == 0, r.stderr
    # a result with a field missing: named
    broken = tmp_path / "broken.json"
    fields = json.loads(result.read_text())
    broken.write_text(json.dumps({k: v for k, v in fields.items() if k != "mean_tpot_ms"}))
    r = autoplan("runs", "import", broken, "--plan", other, "--runs", runs)
    assert r.returncode == 2 and f"{broken}: mean_tpot_ms: missing" in r.stderr
    assert not runs.read_text().count("\n") > 2  # header and the one row taken


def test_the_training_readers_pass_serving_rows_by_and_refuse_an_unknown_kind(tmp_path):
    from autoplan.errors import InputError
    from autoplan.tune.runs import parse_runs
    from autoplan.tune.serving_runs import parse_serving_runs

    runs = tmp_path / "runs.csv"
    training = ROOT / "examples" / "runs" / "tiny-llama-2cpu.csv"
    runs.write_text(training.read_text())
    serving = write_runs(tmp_path / "serving", _plans()[:1])
    assert autoplan("runs", "import", *serving, "--runs", runs).returncode == 0
    text = runs.read_text()
    assert [r.measured_step_time_s for r in parse_runs(text, "runs.csv", training.parent)] == [
        r.measured_step_time_s for r in parse_runs(training.read_text(), "t.csv", training.parent)]
    (run,) = parse_serving_runs(text, "runs.csv")
    assert run.client == "vllm-bench" and run.plan.engine.value == "vllm"
    rows_ = list(csv.reader(io.StringIO(text)))
    rows_[1][rows_[0].index("kind")] = "inference"
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows_)
    bad = out.getvalue()
    with pytest.raises(InputError, match=r"row 1\.kind: expected one of training, serving, got 'inference'"):
        parse_runs(bad, "runs.csv", training.parent)
