"""``autoplan tune --serving``: run the best few serving deployments of ``serve``'s search
on this node, one after another, each measured by its engine's own benchmark client, and
rank them by what they measured.

From ``serve``'s ranked deployments it takes the first ``top_k`` distinct ones (distinct:
another shape, precision or speculative decoding; of deployments differing only in their
batch limit the best predicted stands for its kind) that this node's runner can run (the
others are skipped, each with why: a disaggregated deployment needs its router and two
pools, a replica of more GPUs than a node spans nodes, a draft checkpoint is the user's to
give, an export the engine's launch refuses). Each trial runs one replica of its
deployment: the replica takes its share of the job's traffic (the rate or the concurrency
divided by the replicas, its share of the requests), as a load balancer in front of the
replicas would give it, and the lengths at their means (the clients' random datasets draw
fixed lengths); what it measures is the replica's, its throughput and goodput times the
replicas the deployment's. The prediction the trial is compared with is that replica's
(``serving.evaluate`` of the replica's plan).

A trial (:class:`LocalServingRunner`, module ``runner_local``'s serving side):

1. writes its folder (``<workdir>/trial-<n>-<engine>-<deployment>``): the sidecar
   ``autoplan-trial.json`` (the replica's plan, the deployment it stands for, the traffic,
   the commands; ``runs import`` reads a result with it) and the engine's side files;
2. starts the engine's server with the flags its export writes (``export --to <engine>``:
   the engine spec's ``command`` and ``args``; ``--host 127.0.0.1`` and a free port) in a
   process group of its own, its output in ``engine.log``;
3. waits for the engine's health endpoint, ``GET /health`` (vLLM:
   vllm/entrypoints/openai/api_server.py; SGLang: python/sglang/srt/entrypoints/http_server.py;
   TensorRT-LLM: tensorrt_llm/serve/openai_server.py ``register_routes``), to answer 200,
   at most ``health_timeout_s`` (the run fails then, saying so);
4. runs the engine's benchmark client (:mod:`autoplan.tune.serving_clients`) in a process
   group of its own, its output in ``client.log``, and reads its result;
5. stops the client and the engine: each whole process group, SIGTERM then SIGKILL,
   until no process of it is left (on a failure, a timeout and Ctrl-C too).

Pure library: nothing is printed; ``progress`` is told of events in sentences."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import shlex
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import AutoplanError, InputError, Problem
from autoplan.serving.deployment import Arrival, ArrivalKind, Dist, Lengths, ServingPlan
from autoplan.tune.serving_clients import Client, Measured, client_for, measured_of, mismatches
from autoplan.tune.serving_runs import Predicted, ServingRun, load_of, plan_text

Progress = Callable[[str], None]

POLL_S = 0.1
SIDECAR = "autoplan-trial.json"
SIDECAR_VERSION = 1
ENGINE_LOG = "engine.log"
CLIENT_LOG = "client.log"
TERM_S = 10.0  # seconds a process group has to end after SIGTERM, before SIGKILL
TAIL_BYTES = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingTrial:
    """How to run one deployment."""

    checkpoint: str  # the weights the engine serves: a path or a HuggingFace id (MODEL)
    health_timeout_s: float = 1200.0  # for /health to answer (loading the weights, compiling)
    timeout_s: float = 3600.0  # the whole trial: start, health, the benchmark
    workdir: Path | None = None  # the trial's folder


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingOutcome:
    """What one trial measured, or why it did not."""

    status: str  # ok | timeout | failed
    reason: str = ""
    measured: Measured | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServingTrialResult:
    deployment: ServingPlan  # as the search ranked it
    prediction: Any  # the search's ServingPrediction of the deployment
    replica: ServingPlan  # what ran: one replica at its share of the traffic
    replica_prediction: Any  # the ServingPrediction of the replica
    outcome: ServingOutcome
    searched_rank: int
    started: str = ""  # ISO 8601 UTC
    folder: Path | None = None
    client: str = ""

    @property
    def replicas(self) -> int:
        return self.deployment.deployment.replicas

    @property
    def measured_goodput_rps(self) -> float | None:
        """The deployment's: the replica's goodput times its replicas."""
        m = self.outcome.measured
        return None if m is None or m.goodput_rps is None else m.goodput_rps * self.replicas

    @property
    def measured_tokens_per_s(self) -> float | None:
        m = self.outcome.measured
        return None if m is None else m.output_tokens_per_s * self.replicas

    @property
    def predicted_goodput_rps(self) -> float:
        return float(self.replica_prediction.goodput_rps) * self.replicas

    @property
    def predicted_tokens_per_s(self) -> float:
        return float(self.replica_prediction.output_tokens_per_s) * self.replicas

    def to_dict(self, document: dict[str, Any]) -> dict[str, Any]:
        o, m = self.outcome, self.outcome.measured
        return {
            "plan": document,
            "replica": {"replicas": self.replicas, "load": dataclasses.asdict(load_of(self.replica))},
            "predicted": {**Predicted.of(self.replica_prediction).to_dict(),
                          "deployment_goodput_rps": self.predicted_goodput_rps,
                          "deployment_output_tokens_per_s": self.predicted_tokens_per_s},
            "measured": None if m is None else {**m.to_dict(),
                                                "deployment_goodput_rps": self.measured_goodput_rps,
                                                "deployment_output_tokens_per_s": self.measured_tokens_per_s},
            "status": o.status, "reason": o.reason, "searched_rank": self.searched_rank,
            "client": self.client, "folder": None if self.folder is None else str(self.folder),
            "notes": list(o.notes),
        }


@dataclass(frozen=True, slots=True)
class ServingTuneResult:
    trials: tuple[ServingTrialResult, ...]  # measured first, by measured goodput (module doc)
    skipped: tuple[tuple[int, ServingPlan, str], ...]  # (searched rank, deployment, why)
    interrupted: bool = False

    @property
    def best(self) -> int | None:
        return 0 if self.trials and self.trials[0].outcome.status == "ok" else None


# --------------------------------------------------------------------------- choosing

def distinct_key(plan: ServingPlan) -> tuple:
    """What makes two deployments different trials: all but their batch limits."""
    d = plan.deployment
    return (d.replicas, d.tp, d.pp, d.ep, d.attention_dp, d.weights, d.kv_cache, d.speculative,
            d.disaggregated)


def workload_refusals(plan_or_job: Any, source: str) -> list[Problem]:
    """What a job's workload asks that the benchmark clients cannot drive (before the
    search): a recorded trace (the clients draw arrivals at a rate or concurrency), a shared
    prefix (their random prompts share none), images."""
    w = plan_or_job.workload
    out = []
    if w.arrival.kind is ArrivalKind.TRACE:
        out.append(Problem(source, "workload.arrival", "tune --serving drives a rate, a concurrency or "
                                                       "every request at once (the benchmark clients "
                                                       "replay no trace): give rate_rps or concurrency"))
    if w.prefix is not None:
        out.append(Problem(source, "workload.prefix", "the benchmark clients' random prompts share no "
                                                      "prefix: leave it out to tune"))
    if w.images_per_request:
        out.append(Problem(source, "workload.images_per_request", "the benchmark clients send text "
                                                                  "prompts: leave images out to tune"))
    return out


def replica_plan(plan: ServingPlan) -> tuple[ServingPlan, list[str]]:
    """One replica of ``plan`` at its share of the traffic, on a cluster of its GPUs (module
    doc), and notes on what differs from the job."""
    from autoplan.descriptors.library import with_gpus

    d, w = plan.deployment, plan.workload
    r = d.replicas
    notes = []
    arrival = w.arrival
    if arrival.kind is ArrivalKind.RATE:
        arrival = Arrival(ArrivalKind.RATE, rate_rps=arrival.rate_rps / r)
    elif arrival.kind is ArrivalKind.CONCURRENCY:
        share = max(1, round(arrival.concurrency / r))
        if share * r != arrival.concurrency:
            notes.append(f"concurrency {arrival.concurrency} over {r} replicas: each replica runs {share}")
        arrival = Arrival(ArrivalKind.CONCURRENCY, concurrency=share)
    lengths = []
    for name, length in (("input", w.input_len), ("output", w.output_len)):
        fixed = Lengths(float(max(1, round(length.mean))))
        if length.dist is not Dist.FIXED or fixed.mean != length.mean:
            notes.append(f"{name} lengths drawn {length.dist.value} around {length.mean:g}: the client "
                         f"sends {fixed.mean:g} tokens each")
        lengths.append(fixed)
    requests = max(1, math.ceil(w.requests / r))
    replica = dataclasses.replace(
        plan, cluster=with_gpus(plan.cluster, d.gpus_per_replica),
        deployment=dataclasses.replace(d, replicas=1),
        workload=dataclasses.replace(w, input_len=lengths[0], output_len=lengths[1], arrival=arrival,
                                     requests=requests))
    return replica, notes


def refusal(plan: ServingPlan) -> str | None:
    """Why the local runner cannot run ``plan`` on this node (None: it can)."""
    from autoplan.export.engines import launch_of
    from autoplan.export.serving import refusals

    d = plan.deployment
    if d.disaggregated is not None:
        return ("a disaggregated deployment runs two pools and a router: tune runs aggregated "
                "deployments (export it and run its scripts)")
    if d.gpus_per_replica > plan.cluster.gpus_per_node:
        return (f"a replica of {d.gpus_per_replica} GPUs spans nodes of {plan.cluster.gpus_per_node}: "
                "the local runner runs one node")
    if client_for(plan.engine.value) is None:
        return f"autoplan runs no benchmark client for {plan.engine.value}"
    spec = launch_of(plan.engine)
    if spec is not None and spec.launch_lines(plan):
        return "its launch needs a draft checkpoint (DRAFT_MODEL): export it and run its script"
    found = refusals(plan, plan.engine)
    if found:
        return "; ".join(f"{k}: {v}" for k, v in found)
    return None


def pick(ranked: Sequence[tuple[ServingPlan, Any]], top_k: int
         ) -> tuple[list[tuple[int, ServingPlan, Any]], list[tuple[int, ServingPlan, str]]]:
    """The trials to run (searched rank, deployment, its prediction) and the deployments
    refused on the way, one note for each kind."""
    chosen: list[tuple[int, ServingPlan, Any]] = []
    skipped: list[tuple[int, ServingPlan, str]] = []
    seen: set[tuple] = set()
    for i, (plan, pred) in enumerate(ranked, start=1):
        if len(chosen) >= top_k:
            break
        key = distinct_key(plan)
        if key in seen:
            continue
        seen.add(key)
        why = refusal(plan)
        if why:
            skipped.append((i, plan, why))
            continue
        chosen.append((i, plan, pred))
    return chosen, skipped


# --------------------------------------------------------------------------- launching

def engine_command(plan: ServingPlan, checkpoint: str, port: int, folder: Path
                   ) -> tuple[list[str], dict[str, str]]:
    """The engine's server command for ``plan`` (its export's command and flags:
    autoplan/export/serving.py ``_script``, with this node's port), every path absolute,
    and the side files it reads (name -> text, written into ``folder``)."""
    from autoplan.export.engines import launch
    from autoplan.serving.cost import StepModel

    spec = launch(plan.engine)
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine, plan.engine_version)
    words = [checkpoint if w == "$MODEL" else w for w in shlex.split(spec.command)]
    flags = [part for arg in spec.args(plan, step) for part in arg]
    side = spec.side_files(plan, step)
    extra = [part for name in side for part in (spec.side_flag, str(folder.absolute() / name))]
    return [*words, "--host", "127.0.0.1", "--port", str(port), *flags, *extra], side


def _module_of(argv: Sequence[str]) -> str | None:
    """The module of ``python -m MODULE ...``, else None."""
    if len(argv) > 2 and argv[1] == "-m" and Path(argv[0]).name.startswith("python"):
        return argv[2]
    return None


def missing_program(argv: Sequence[str], env: dict[str, str] | None = None) -> str | None:
    """Why ``argv`` cannot start on this node (its program not on PATH, or a ``python -m``
    module not importable by that python), else None."""
    path = (env or os.environ).get("PATH")
    exe = shutil.which(argv[0], path=path)
    if exe is None:
        return f"{argv[0]}: not found on PATH"
    module = _module_of(argv)
    if module is not None:
        probe = ("import importlib.util, sys\n"
                 "try:\n    found = importlib.util.find_spec(sys.argv[1]) is not None\n"
                 "except ImportError:\n    found = False\nsys.exit(0 if found else 1)")
        try:
            ok = subprocess.run([exe, "-c", probe, module], env=env, capture_output=True,
                                timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if not ok:
            return f"{argv[0]} -m {module}: no module {module} for {exe}"
    return None


def check_programs(plans: Sequence[ServingPlan]) -> None:
    """Before any trial: each engine's server and benchmark client can start here (an
    InputError naming --runner, exit 2, otherwise)."""
    from autoplan.export.engines import launch

    problems: list[Problem] = []
    seen: set[str] = set()
    for plan in plans:
        if plan.engine.value in seen:
            continue
        seen.add(plan.engine.value)
        client = client_for(plan.engine.value)
        assert client is not None  # refusal() took the others out
        spec = launch(plan.engine)
        server = [w for w in shlex.split(spec.command) if w != "$MODEL"]
        how = spec.pip_of(plan.engine_release)
        for argv, what in ((server, "server"), (list(client.program), "benchmark client")):
            why = missing_program(argv)
            if why:
                problems.append(Problem("--runner", "", f"local: {plan.engine.value}'s {what}: {why}"
                                        + (f" (install it: {how})" if how and what == "server" else "")))
    if problems:
        raise InputError(problems)


def free_port() -> int:
    """A TCP port of 127.0.0.1 no one listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def healthy(port: int) -> bool:
    """Whether the engine's ``GET /health`` answers 200 (no proxy: it is this node's)."""
    try:
        with _NO_PROXY.open(f"http://127.0.0.1:{port}/health", timeout=2.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    """End ``proc``'s whole process group (its children too, which may outlive it):
    SIGTERM, then SIGKILL after ``TERM_S``, until no process of the group is left."""
    from autoplan.tune.runners import end_group

    if proc is None:
        return
    end_group(proc, term_s=TERM_S, kill_s=TERM_S)
    proc.poll()


def _tail(path: Path, lines: int = 3) -> str:
    from autoplan.tune.runners import _tail as tail

    return tail(path, lines=lines)


def sidecar(replica: ServingPlan, deployment: ServingPlan, rank: int, checkpoint: str, client: Client,
            predicted: Predicted, engine_argv: Sequence[str], client_argv: Sequence[str]) -> dict[str, Any]:
    """What the trial's folder says of its run (module doc)."""
    return {
        "autoplan_trial": SIDECAR_VERSION,
        "engine": replica.engine.value, "release": replica.engine_release, "client": client.name,
        "result": client.result, "checkpoint": checkpoint,
        "deployment": deployment.deployment.label(), "replicas": deployment.deployment.replicas,
        "searched_rank": rank, "load": dataclasses.asdict(load_of(replica)),
        "plan": json.loads(plan_text(replica)), "predicted": predicted.to_dict(),
        "engine_command": list(engine_argv), "client_command": list(client_argv),
    }


@dataclass(frozen=True, slots=True)
class LocalServingRunner:
    """This node: the engine's server and its benchmark client as local processes."""

    name: str = "local"
    env: tuple[tuple[str, str], ...] = ()  # more environment for the engine and the client

    def run(self, replica: ServingPlan, deployment: ServingPlan, rank: int, predicted: Predicted,
            trial: ServingTrial, progress: Progress) -> ServingOutcome:
        assert trial.workdir is not None
        folder = trial.workdir.absolute()
        client = client_for(replica.engine.value)
        assert client is not None
        port = free_port()
        load = load_of(replica)
        try:
            argv, side = engine_command(replica, trial.checkpoint, port, folder)
        except AutoplanError as exc:
            return ServingOutcome(status="failed", reason=f"its launch: {exc}")
        client_argv = client.command(load, trial.checkpoint, port, folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in side.items():
                (folder / name).write_text(text)
            (folder / SIDECAR).write_text(json.dumps(
                sidecar(replica, deployment, rank, trial.checkpoint, client, predicted, argv, client_argv),
                indent=1) + "\n")
            (folder / client.result).unlink(missing_ok=True)
        except OSError as exc:
            return ServingOutcome(status="failed",
                                  reason=f"{folder}: cannot write the trial: {exc.strerror or exc}")
        gpus = replica.deployment.gpus_per_replica
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus)), **dict(self.env)}
        started = time.monotonic()
        engine = bench = None
        try:
            with open(folder / ENGINE_LOG, "wb") as log:
                try:
                    engine = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
                except OSError as exc:
                    return ServingOutcome(status="failed", reason=f"{argv[0]}: {exc.strerror or exc}")
            progress(f"started {replica.engine.value} on port {port} (pid {engine.pid}); waiting for /health")
            health_limit = min(trial.health_timeout_s, trial.timeout_s)
            while not healthy(port):
                code = engine.poll()
                if code is not None:
                    return ServingOutcome(status="failed", reason=(
                        f"the engine exited (status {code}) before /health answered: "
                        + _tail(folder / ENGINE_LOG)))
                waited = time.monotonic() - started
                if waited > health_limit:
                    flag = "--health-timeout" if trial.health_timeout_s <= trial.timeout_s else "--timeout"
                    return ServingOutcome(status="failed", reason=(
                        f"health timeout: /health did not answer 200 in {health_limit:g} s ({flag}); "
                        f"the engine was stopped: " + _tail(folder / ENGINE_LOG)))
                time.sleep(POLL_S)
            progress(f"healthy after {time.monotonic() - started:.1f} s; {client.name}: {load.label()}")
            with open(folder / CLIENT_LOG, "wb") as log:
                try:
                    bench = subprocess.Popen(client_argv, cwd=folder, env=env, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
                except OSError as exc:
                    return ServingOutcome(status="failed", reason=f"{client_argv[0]}: {exc.strerror or exc}")
            while bench.poll() is None:
                if time.monotonic() - started > trial.timeout_s:
                    return ServingOutcome(status="timeout", reason=(
                        f"stopped after {trial.timeout_s:g} s (--timeout) with the benchmark running: "
                        + _tail(folder / CLIENT_LOG)))
                time.sleep(POLL_S)
            if bench.returncode != 0:
                return ServingOutcome(status="failed", reason=(
                    f"{client.name} exited with status {bench.returncode}: " + _tail(folder / CLIENT_LOG)))
            return self._read(client, folder, load)
        finally:
            stop_group(bench)
            stop_group(engine)

    def _read(self, client: Client, folder: Path, load: Any) -> ServingOutcome:
        from autoplan.tune.serving_clients import read_result_file

        path = folder / client.result
        if not path.is_file():
            return ServingOutcome(status="failed", reason=f"{client.name} wrote no {client.result}: "
                                                          + _tail(folder / CLIENT_LOG))
        try:
            found, doc = read_result_file(path)
            if found.name != client.name:
                return ServingOutcome(status="failed", reason=f"{path.name}: written by {found.name}, "
                                                              f"not {client.name}")
            measured = measured_of(client, doc, str(path), load)
        except InputError as exc:
            return ServingOutcome(status="failed", reason=f"its result is no measurement: {exc}")
        wrong = mismatches(measured, load)
        if wrong:
            return ServingOutcome(status="failed", measured=None, reason=(
                f"{path.name} ran other traffic than asked: " + "; ".join(f"{k}: {v}" for k, v in wrong)))
        if measured.completed < 1:
            return ServingOutcome(status="failed", reason=f"{path.name}: no request completed")
        notes: tuple[str, ...] = ()
        if measured.failed:
            notes = (f"{measured.failed} of {measured.failed + measured.completed} requests failed",)
        return ServingOutcome(status="ok", measured=measured, notes=notes)


# --------------------------------------------------------------------------- the loop

def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").replace("--", "-")


def rank_key(t: ServingTrialResult) -> tuple:
    """Measured first, by the deployment's measured goodput under the SLO (output tokens
    per second where the job gives none), then the searched order."""
    slo = t.deployment.slo
    score = (t.measured_goodput_rps if slo.any else t.measured_tokens_per_s) or 0.0
    return (-score, t.searched_rank)


def tune_serving(ranked: Sequence[tuple[ServingPlan, Any]], runner: LocalServingRunner,
                 trial: ServingTrial, *, top_k: int = 3, workdir: Path, progress: Progress = lambda _: None,
                 stop: Callable[[], bool] = lambda: False,
                 done: Callable[[ServingTrialResult], None] = lambda _: None) -> ServingTuneResult:
    """Run the chosen deployments (:func:`pick`) one after another; see module doc."""
    from autoplan.serving.evaluate import evaluate_serving

    chosen, skipped = pick(ranked, top_k)
    results: list[ServingTrialResult] = []
    interrupted = False
    for n, (rank, plan, pred) in enumerate(chosen, start=1):
        if stop():
            break
        replica, notes = replica_plan(plan)
        replica_pred = evaluate_serving(replica)
        client = client_for(plan.engine.value)
        assert client is not None
        folder = workdir / f"trial-{n}-{plan.engine.value}-{_slug(plan.deployment.label())}"
        spec = dataclasses.replace(trial, workdir=folder)
        r = plan.deployment.replicas
        progress(f"trial {n} of {len(chosen)}: {plan.deployment.label()} on {plan.engine.value} "
                 f"{plan.engine_release} ({'its replica' if r == 1 else f'one of its {r} replicas'}: "
                 f"{load_of(replica).label()})")
        started = _now()

        def told(line: str, n: int = n) -> None:
            progress(f"trial {n}: {line}")

        try:
            outcome = runner.run(replica, plan, rank, Predicted.of(replica_pred), spec, told)
        except KeyboardInterrupt:
            outcome = ServingOutcome(status="failed", reason="interrupted (Ctrl-C): the run was stopped")
            interrupted = True
        outcome = dataclasses.replace(outcome, notes=tuple(notes) + outcome.notes)
        result = ServingTrialResult(plan, pred, replica, replica_pred, outcome, rank, started, folder,
                                    client.name)
        results.append(result)
        done(result)
        if interrupted:
            break
    ok = sorted((r for r in results if r.outcome.status == "ok"), key=rank_key)
    rest = [r for r in results if r.outcome.status != "ok"]
    return ServingTuneResult(tuple(ok + rest), tuple(skipped), interrupted)


def runs_of(result: ServingTuneResult, runner: str) -> list[ServingRun]:
    """The runs log rows of a serving tuning (every trial, measured or not)."""
    return [ServingRun(plan=t.replica, replicas=t.replicas, label=t.deployment.deployment.label(),
                       client=t.client, status=t.outcome.status, reason=t.outcome.reason,
                       measured=t.outcome.measured, predicted=Predicted.of(t.replica_prediction),
                       source="tune", runner=runner, time=t.started)
            for t in result.trials]


# --------------------------------------------------------------------------- import

@dataclass(frozen=True, slots=True)
class Sidecar:
    """What a trial's ``autoplan-trial.json`` says of the run beside it."""

    plan: ServingPlan
    replicas: int
    label: str
    client: str
    predicted: Predicted | None


def read_sidecar(path: Path) -> Sidecar:
    """The sidecar at ``path``; every problem named by file and field."""
    from autoplan.descriptors.strict import Fields, read_limited
    from autoplan.serving.planfile import read_serving_plan
    from autoplan.tune.serving_clients import CLIENTS, Stats

    raw = read_limited(path, 16 * 2**20, "a trial's sidecar")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError.single(str(path), "", f"not JSON: {str(exc)[:160]}") from None
    problems: list[Problem] = []
    f = Fields(data, str(path), "", problems)
    version = f.int("autoplan_trial")
    if version is not None and version != SIDECAR_VERSION:
        f.fail("autoplan_trial", f"expected {SIDECAR_VERSION}, got {version}")
    client = f.str("client")
    if client is not None and client not in CLIENTS:
        f.fail("client", f"expected one of {', '.join(CLIENTS)}, got {client[:40]!r}")
    replicas = f.int("replicas", 1, min=1, max=1 << 20)
    label = f.str("deployment", "")
    doc = f.raw("plan")
    pred = f.raw("predicted", None)
    f.close(("engine", "release", "result", "checkpoint", "searched_rank", "load", "engine_command",
             "client_command"))
    if problems:
        raise InputError(problems)
    plan = read_serving_plan(doc, f"{path}: plan")
    predicted = None
    if isinstance(pred, dict):
        try:
            def stats(d: Any) -> Stats:
                return Stats(float(d["mean"]), d.get("p50"), d.get("p99"))

            predicted = Predicted(ttft_ms=stats(pred["ttft_ms"]), tpot_ms=stats(pred["tpot_ms"]),
                                  requests_per_s=float(pred["requests_per_s"]),
                                  output_tokens_per_s=float(pred["output_tokens_per_s"]),
                                  goodput_rps=float(pred["goodput_rps"]))
        except (KeyError, TypeError, ValueError):
            raise InputError.single(str(path), "predicted", "expected ttft_ms, tpot_ms, requests_per_s, "
                                                            "output_tokens_per_s, goodput_rps") from None
    assert client is not None and replicas is not None
    return Sidecar(plan, replicas, label or "", client, predicted)
