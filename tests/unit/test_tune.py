"""The auto-tuner loop's library (autoplan/tune/): the launchers' logs read back, the runs
log written and read, which plans tune runs and how it ranks them, calibrate's fit and its
held-out report, and the launch runners end to end under stand-in launchers
(tests/data/standin: torchrun, sbatch, srun, scontrol and scancel that print Megatron-LM's
and torchtitan's own log lines in a fraction of a second)."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.library import resolve_cluster, resolve_model, resolve_stack
from autoplan.errors import InputError
from autoplan.plan import Plan
from autoplan.schedules import Schedule
from autoplan.tune.calibrate import calibrate, constants_of, descend, golden, identifiable, with_constants
from autoplan.tune.logs import MEGATRON, TORCHTITAN, read_log
from autoplan.tune.runners import LaunchRunner, Outcome, Trial, deadline_s, diverged
from autoplan.tune.runs import COLUMNS, Run, csv_text, latest, parse_runs, plan_id
from autoplan.tune.tune import pick, runs_of, tune
from autoplan.vocab import Recompute, ZeroStage
from tests.helpers import make_plan

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "data" / "standin"
CPU = ROOT / "examples" / "cpu"


def cpu_plan(dp: int = 2, tp: int = 1, pp: int = 1, micro_batch: int = 4, vpp: int = 1,
             schedule: Schedule = Schedule.ONE_F_ONE_B, global_batch: int = 8) -> Plan:
    """tiny-llama on the two-process CPU descriptor (examples/cpu)."""
    from autoplan.descriptors.job import Job
    from autoplan.plan import Layout

    return Plan(model=resolve_model(str(CPU / "tiny-llama.yaml")),
                cluster=resolve_cluster(str(CPU / "local-cpu.yaml")),
                job=Job(global_batch=global_batch, seq_len=256),
                layout=Layout(dp=dp, tp=tp, pp=pp, vpp=vpp), micro_batch=micro_batch,
                schedule=schedule, sequence_parallel=tp > 1, recompute=Recompute.NONE,
                zero=ZeroStage.NONE)


# --------------------------------------------------------------------------- logs

# a log as Megatron-LM prints it (training.py training_log, report_memory), three iterations
MEGATRON_LOG = (ROOT / "tests" / "data" / "logs" / "megatron.log").read_text()
TITAN_LOG = (
    "[titan] 2026-11-27 10:00:01,000 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss: 10.4000  "
    "\x1b[33mmemory:  1.25GiB(10.00%)  \x1b[34mtps: 1,024  \x1b[36mtflops: 0.10  mfu: 0.01%\x1b[39m\n"
    "[titan] 2026-11-27 10:00:02,000 - root - INFO - step:  2  loss:  9.9000  grad_norm:  4.0000  "
    "memory:  1.50GiB(12.00%)  wps: 2,048\n")


def test_megatron_log_gives_each_iterations_time_and_the_max_reserved_memory():
    r = read_log(MEGATRON_LOG)
    assert r.format == MEGATRON and not r.oom
    assert r.step_times_s == ((1, 2.1005), (2, 1.0), (3, 1.2))
    assert r.peak_gib == pytest.approx(2048 / 1024)
    assert r.timed(1) == [1.0, 1.2]


def test_torchtitan_log_gives_step_time_from_tokens_per_second_per_device():
    # 2,048 tokens a step on 2 GPUs at 1,024 tokens/s per device: 1 s; at 2,048 (old wps:) 0.5 s
    r = read_log(TITAN_LOG, tokens_per_step=2048, gpus=2)
    assert r.format == TORCHTITAN
    assert r.step_times_s == ((1, 1.0), (2, 0.5))
    assert r.peak_gib == 1.5
    assert read_log(TITAN_LOG).step_times_s == () and read_log(TITAN_LOG).notes


def test_an_out_of_memory_error_marks_the_log_and_no_step_line_no_format():
    assert read_log("x\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate").oom
    assert read_log("nothing here").format == ""


# --------------------------------------------------------------------------- runs log

def test_runs_log_round_trips_plans_and_measurements():
    a, b = cpu_plan(), cpu_plan(dp=1, tp=2, micro_batch=8)
    runs = [Run(plan=a, measured_step_time_s=3.5, measured_peak_gib=0.75, predicted_step_time_s=1.4,
                source="tune", runner="local", time="2026-11-27T10:00:00+00:00", steps=3),
            Run(plan=b, status="oom", reason="ran out\nof memory", source="tune", runner="local")]
    text = csv_text(runs)
    assert text.splitlines()[0].split(",") == list(COLUMNS)
    back = parse_runs(text, "runs.csv", ROOT)
    assert [r.plan_id for r in back] == [plan_id(a), plan_id(b)]
    assert back[0].ok and back[0].measured_step_time_s == 3.5 and back[0].steps == 3
    assert not back[1].ok and back[1].reason == "ran out of memory"  # one line a row
    # appending keeps what was there
    more = csv_text(runs[:1], text)
    assert len(parse_runs(more, "runs.csv", ROOT)) == 3
    with pytest.raises(InputError, match="unknown column .a."):
        csv_text(runs, "a,b\n1,2\n")


def test_a_users_own_csv_of_past_jobs_reads_from_its_columns():
    text = ("model,cluster,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,zero,measured_step_time_s\n"
            "llama3-8b,dgx-h100,64,512,8192,32,1,2,1,1,4.5\n"
            "tiny-llama.yaml,local-cpu.yaml,2,8,256,2,1,1,4,0,3.1\n")
    first, second = parse_runs(text, "mine.csv", CPU)
    assert first.plan.layout.gpus == 64 and first.plan.model.name == "llama3-8b"
    assert second.plan.model.name == "tiny-llama"  # a path relative to the CSV's folder
    assert second.plan_id == plan_id(dataclasses.replace(cpu_plan(), stack=second.plan.stack))


@pytest.mark.parametrize(("text", "where"), [
    ("model,cluster,measured_step_time_s,bogus\n", "column 'bogus'"),
    ("model,cluster\nllama3-8b,dgx-h100\n", "missing column measured_step_time_s"),
    ("model,measured_step_time_s\nllama3-8b,1\n", "missing columns cluster"),
    ("model,cluster,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s\n"
     "llama3-8b,dgx-h100,8,64,4096,8,1,1,1,nan\n", "row 1.measured_step_time_s"),
    ("model,cluster,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s,status\n"
     "llama3-8b,dgx-h100,8,64,4096,8,1,1,1,1,great\n", "row 1.status"),
    ("model,cluster,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s\n"
     "llama3-8b,dgx-h100,8,64,4096,3,1,1,1,1\n", "row 1.layout"),
    ("model,cluster,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s\n"
     "llama3-8b,dgx-h100,8,64,4096,8,1,1,1,1,extra\n", "row 1: more values"),
    ("plan,measured_step_time_s\n{not json,1\n", "row 1.plan"),
    ("", "empty"),
])
def test_a_bad_runs_log_names_the_row_and_the_column(text, where):
    with pytest.raises(InputError) as exc:
        parse_runs(text, "runs.csv", ROOT)
    assert "runs.csv" in str(exc.value) and where in str(exc.value)


def test_latest_runs_of_a_plan_are_its_measured_ones_by_time():
    a, b = cpu_plan(), cpu_plan(dp=1, tp=2, micro_batch=8)
    runs = [Run(plan=a, measured_step_time_s=2.0, time="2026-11-27T10:00:00"),
            Run(plan=b, measured_step_time_s=9.0, time="2026-11-27T11:00:00"),
            Run(plan=a, status="failed", time="2026-11-27T12:00:00"),
            Run(plan=a, measured_step_time_s=1.0, time="2026-11-27T09:00:00")]
    assert [r.measured_step_time_s for r in latest(runs, a)] == [1.0, 2.0]


# --------------------------------------------------------------------------- which trials, ranked

@dataclasses.dataclass
class FakeRunner:
    """Measures each plan at ``factor`` x its prediction (``times``: by layout), refuses pp > 1."""

    name: str = "fake"
    factor: float = 2.0
    times: dict | None = None
    fail: tuple = ()
    ran: list = dataclasses.field(default_factory=list)
    interrupt_at: int | None = None

    def refuses(self, plan):
        return "no pipelines here" if plan.layout.pp > 1 else None

    def run(self, plan, trial, progress):
        self.ran.append(plan)
        if self.interrupt_at == len(self.ran):
            raise KeyboardInterrupt
        progress("running")
        if plan.layout in self.fail:
            return Outcome(status="oom", reason="ran out")
        t = (self.times or {}).get(plan.layout, self.factor * trial.predicted_step_s)
        return Outcome(status="ok", step_time_s=t, peak_gib=1.0, step_times_s=(t,))


def ranked_cpu_plans() -> list[tuple[Plan, object]]:
    plans = [cpu_plan(dp=1, tp=2, micro_batch=8), cpu_plan(dp=1, tp=2, micro_batch=4),
             cpu_plan(dp=2, micro_batch=4), cpu_plan(dp=1, pp=2, micro_batch=2),
             cpu_plan(dp=2, micro_batch=2), cpu_plan(dp=2, micro_batch=1, global_batch=8)]
    return [(p, evaluate(p)) for p in plans]


def test_pick_takes_distinct_layouts_the_runner_runs_and_notes_each_refusal_once():
    ranked = ranked_cpu_plans()
    ranked.insert(4, ranked[3])  # a second pp=2 plan: one note
    chosen, skipped = pick(ranked, FakeRunner(), top_k=3)
    assert [c[0] for c in chosen] == [1, 3]  # tp2 (best), dp2; the other tp2 and dp2 are repeats
    assert [(s[0], s[2]) for s in skipped] == [(4, "no pipelines here")]
    best = ranked[0][1].step_time_s
    far = [(p, dataclasses.replace(pred, step_time_s=best * 2)) if i else (p, pred)
           for i, (p, pred) in enumerate(ranked)]
    assert len(pick(far, FakeRunner(), top_k=3, within=0.05)[0]) == 1


def test_tune_ranks_by_measurement_keeps_failures_last_and_stops_when_asked():
    ranked = ranked_cpu_plans()
    tp2, dp2 = ranked[0][0].layout, ranked[2][0].layout
    runner = FakeRunner(times={tp2: 5.0, dp2: 2.0})
    result = tune(ranked, runner, Trial(steps=3), top_k=2)
    assert [t.plan.layout for t in result.trials] == [dp2, tp2]  # measured fastest first
    assert result.best == 0 and result.trials[0].searched_rank == 3
    failing = tune(ranked, FakeRunner(fail=(tp2,)), Trial(), top_k=2)
    assert [t.outcome.status for t in failing.trials] == ["ok", "oom"] and failing.best == 0
    assert tune(ranked, FakeRunner(fail=(tp2, dp2)), Trial(), top_k=2).best is None
    stopped = tune(ranked, runner, Trial(), top_k=2, stop=lambda: True)
    assert stopped.trials == () and stopped.best is None
    rows = runs_of(result, "fake", 3)
    assert [r.measured_step_time_s for r in rows] == [2.0, 5.0] and rows[0].source == "tune"


def test_a_trial_measuring_what_the_runs_log_refuses_is_logged_as_failed_and_the_rest_written():
    ranked = ranked_cpu_plans()
    tp2, dp2 = ranked[0][0].layout, ranked[2][0].layout
    result = tune(ranked, FakeRunner(times={tp2: 1e-300, dp2: 2.0}), Trial(steps=3), top_k=2)
    rows = {r.plan.layout: r for r in runs_of(result, "fake", 3)}
    assert rows[dp2].status == "ok" and rows[tp2].status == "failed"
    assert rows[tp2].measured_step_time_s is None and "not a measurement" in rows[tp2].reason
    assert rows[tp2].predicted_step_time_s == pytest.approx(ranked[0][1].step_time_s)
    back = parse_runs(csv_text(rows.values()), "runs.csv", ROOT)  # the whole tuning is written
    assert sorted(r.status for r in back) == ["failed", "ok"]


def test_an_interrupted_trial_ends_the_tuning_and_keeps_what_was_measured():
    result = tune(ranked_cpu_plans(), FakeRunner(interrupt_at=2), Trial(), top_k=3)
    assert result.interrupted
    assert [t.outcome.status for t in result.trials] == ["ok", "failed"]
    assert "interrupted" in result.trials[1].outcome.reason


def test_a_trials_deadline_counts_its_prediction_times_the_divergence_factor():
    trial = Trial(steps=3, warmup=2, timeout_s=1e6, diverge=3.0, predicted_step_s=2.0)
    assert deadline_s("local", trial) == 90.0 + (2 + 3 + 2) * 2.0 * 3.0  # hand count
    assert deadline_s("local", dataclasses.replace(trial, timeout_s=10.0)) == 10.0
    assert diverged(7.0, 2.0, 3.0) and diverged(0.5, 2.0, 3.0) and not diverged(5.0, 2.0, 3.0)


# --------------------------------------------------------------------------- calibrate

def test_golden_section_finds_a_parabolas_minimum():
    assert golden(lambda x: (x - 0.3) ** 2, 0.0, 1.0, steps=40) == pytest.approx(0.3, abs=1e-6)
    p = descend(lambda q: (q["a"] - 2) ** 2 + (q["b"] + 1) ** 2, {"a": 0.0, "b": 0.0}, ["a", "b"],
                lambda _: (-5.0, 5.0), sweeps=3)
    assert p == {"a": 2.0, "b": -1.0}


def synthetic_runs(truth: dict[str, float]) -> list[Run]:
    """Runs 'measured' as autoplan predicts them under the stack with ``truth``'s constants."""
    base = resolve_stack("torchtitan")
    true = with_constants(base, truth)
    plans = [cpu_plan(dp=1, tp=2, micro_batch=8), cpu_plan(dp=1, pp=2, micro_batch=1),
             cpu_plan(dp=2, micro_batch=4, global_batch=64)]
    plans = [dataclasses.replace(p, stack=base) for p in plans]
    return [Run(plan=p, measured_step_time_s=evaluate(dataclasses.replace(p, stack=true)).step_time_s)
            for p in plans]


def test_calibrate_recovers_the_constants_the_runs_were_made_with_and_cuts_held_out_error():
    runs = synthetic_runs({"compute_efficiency": 0.4, "step_overhead_ms": 500.0})
    base = resolve_stack("torchtitan")
    result = calibrate(runs, base, "mine")
    assert result.fitted["compute_efficiency"] == pytest.approx(0.4, abs=0.02)
    assert result.fitted.get("step_overhead_ms", 500.0) == pytest.approx(500.0, rel=0.1)
    before = sum(abs(h.before_s / h.measured_s - 1) for h in result.held_out)
    after = sum(abs(h.after_s / h.measured_s - 1) for h in result.held_out)
    assert after < before / 5
    assert result.stack.name == "mine" and result.loss_after < result.loss_before
    assert len(result.held_out) == 3 and result.groups == 3


def test_calibrate_refuses_what_the_runs_cannot_identify_and_says_why():
    runs = synthetic_runs({"compute_efficiency": 0.5})
    graphs = dataclasses.replace(resolve_stack("torchtitan"), cuda_graphs=True)
    result = calibrate(runs, graphs, "g")
    assert "host_kernel_us" not in result.fitted and "CUDA graphs" in result.not_fitted["host_kernel_us"]
    same = [dataclasses.replace(r, group="one") for r in runs]
    with pytest.raises(InputError, match="at least two"):
        calibrate(same, graphs, "g")
    with pytest.raises(InputError, match="no run with status ok"):
        calibrate([Run(plan=runs[0].plan, status="oom")], graphs, "g")
    # two runs of one step time: a slower kernel and a longer fixed cost move them alike
    alike = [runs[0], dataclasses.replace(runs[0], group="again")]
    names, why = identifiable([r.plan for r in alike], graphs, {
        "compute_efficiency": (0.05, 1.0), "step_overhead_ms": (0.0, 1e4)})
    assert names == ["compute_efficiency"] and "cannot tell" in why["step_overhead_ms"]
    assert constants_of(with_constants(graphs, {"step_overhead_ms": 7.0}))["step_overhead_ms"] == 7.0


# --------------------------------------------------------------------------- launch runners

@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in launchers first on PATH; the pids each run wrote, the jobs cancelled."""
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    pids = tmp_path / "pids"
    monkeypatch.setenv("STANDIN_PIDS", str(pids))
    monkeypatch.setenv("STANDIN_CANCELLED", str(tmp_path / "cancelled"))
    monkeypatch.setenv("STANDIN_STEP_MS", "20")
    monkeypatch.setenv("STANDIN_TOKENS", str(8 * 256))
    return tmp_path


def alive(pids: Path) -> list[int]:
    """The stand-ins' processes still running (a zombie waiting for its reaper is not)."""
    out = []
    for pid in (int(x) for x in pids.read_text().split()) if pids.exists() else ():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


@pytest.mark.parametrize(("name", "launcher"), [("torchrun", "megatron"), ("torchrun", "torchtitan"),
                                                 ("slurm", "megatron"), ("slurm", "torchtitan")])
def test_a_launch_runner_runs_the_export_and_reads_the_launchers_log(standin, name, launcher):
    plan = cpu_plan()
    trial = Trial(steps=3, warmup=2, timeout_s=60, predicted_step_s=0.02, workdir=standin / "t")
    events: list[str] = []
    out = LaunchRunner(name=name, launcher=launcher).run(plan, trial, events.append)
    assert out.status == "ok", out.reason
    assert out.step_time_s == pytest.approx(0.02, rel=0.05) and len(out.step_times_s) == 3
    assert out.peak_gib == pytest.approx(2.0 if launcher == "megatron" else 1.5)
    assert not alive(standin / "pids")  # the run was stopped once its steps were logged
    written = ("job.sbatch" if name == "slurm" else
               "torchtitan.toml" if launcher == "torchtitan" else "pretrain_megatron.sh")
    assert (standin / "t" / written).exists()
    if name == "slurm":
        assert events and events[0].startswith("submitted job")


@pytest.mark.parametrize(("mode", "status", "words"), [
    ("oom", "oom", "out of memory"), ("slow", "failed", "diverged"), ("crash", "failed", "NCCL error"),
    ("hang", "timeout", "--timeout")])
def test_a_launch_that_fails_is_stopped_and_says_why(standin, monkeypatch, mode, status, words):
    monkeypatch.setenv("STANDIN_MODE", mode)
    trial = Trial(steps=3, warmup=1, timeout_s=0.8, predicted_step_s=0.02 if mode != "hang" else 0.0,
                  workdir=standin / "t")
    started = time.monotonic()
    out = LaunchRunner(name="torchrun").run(cpu_plan(), trial, lambda _: None)
    assert out.status == status and words in out.reason, out.reason
    assert time.monotonic() - started < 10
    assert not alive(standin / "pids")


def test_a_keyboard_interrupt_stops_the_launch_before_it_propagates(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "hang")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            LaunchRunner(name="torchrun").run(cpu_plan(), Trial(timeout_s=60, workdir=standin / "t"),
                                              lambda _: None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    time.sleep(0.2)
    assert not alive(standin / "pids")


def test_launch_runners_refuse_what_their_launcher_cannot_run():
    big = make_plan(gpus=16, dp=16)
    assert "one node" in LaunchRunner(name="torchrun").refuses(big)
    assert LaunchRunner(name="slurm").refuses(big) is None
    zb = make_plan(gpus=8, dp=4, pp=2, schedule=Schedule.ZB_H2, micro_batch=1)
    assert LaunchRunner(name="torchrun", launcher="megatron").refuses(zb)



# --------------------------------------------------------------------------- learned from runs

def test_the_runs_forest_learns_measured_over_predicted_for_a_new_plan():
    from autoplan.tune.residual import FEATURES, features, fit_residual

    plans = [cpu_plan(dp=1, tp=2, micro_batch=8), cpu_plan(dp=2, micro_batch=4),
             cpu_plan(dp=1, pp=2, micro_batch=1)]
    # every run measured twice its prediction: every tree learns ln 2, the band is a point
    runs = [Run(plan=p, measured_step_time_s=2 * evaluate(p).step_time_s) for p in plans]
    learned = fit_residual(runs)
    new = cpu_plan(dp=2, micro_batch=2)
    pred = evaluate(new)
    assert len(features(new, pred)) == len(FEATURES)
    assert learned.band(new, pred) == pytest.approx((2 * pred.step_time_s,) * 3)
    with pytest.raises(InputError, match="at least 3"):
        fit_residual(runs[:2])


def test_the_local_runner_refuses_a_plan_past_the_machines_memory_or_of_a_gpu_cluster():
    from autoplan.tune.runners import LocalRunner, _machine

    pytest.importorskip("torch")
    machine = _machine("cpu")
    big = cpu_plan(dp=2, micro_batch=4)
    huge = dataclasses.replace(big, model=dataclasses.replace(big.model, hidden=65536, heads=64,
                                                              kv_heads=64, ffn_hidden=4 * 65536))
    assert "predicted to need" in LocalRunner().refuses(huge)
    assert machine.mem_bytes > 0
    gpu = make_plan("llama3-8b", gpus=2, dp=2, global_batch=8, seq_len=256)
    assert "built-in GPU cluster" in LocalRunner().refuses(gpu)
