"""The torchrun and slurm runners as a user meets them (issue 47): `tune` with the default
--workdir (relative, so every path the launch is given must be made absolute: it runs in
its trial's folder), and launches whose logs or controller are hostile, each stopped
within its --timeout, under the stand-in launchers of tests/data/standin."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from autoplan.tune.runners import TAIL_LINE_CHARS, LaunchRunner, Trial, _tail
from tests.helpers import autoplan, cpu_seconds
from tests.unit.test_tune import alive, cpu_plan

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "data" / "standin"
CPU = ROOT / "examples" / "cpu"
SEARCH = ["--model", CPU / "tiny-llama.yaml", "--cluster", CPU / "local-cpu.yaml", "--gpus", "2",
          "--global-batch", "8", "--seq-len", "256"]


@pytest.fixture
def env(tmp_path):
    return {"PATH": f"{STANDIN}{os.pathsep}{os.environ['PATH']}", "STANDIN_STEP_MS": "10",
            "STANDIN_PIDS": str(tmp_path / "pids"), "STANDIN_TOKENS": str(8 * 256)}


@pytest.fixture
def standin(tmp_path, monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STANDIN_CANCELLED", str(tmp_path / "cancelled"))
    return tmp_path


@pytest.mark.parametrize(("runner", "launcher"), [("torchrun", "megatron"), ("torchrun", "torchtitan"),
                                                   ("slurm", "megatron"), ("slurm", "torchtitan")])
def test_tune_runs_each_launch_with_the_default_workdir(tmp_path, env, runner, launcher):
    # the README's command, from a folder of the user's: its trials go to ./autoplan-tune
    r = autoplan("tune", *SEARCH, "--diverge", "1000", "--runner", runner, "--launcher", launcher,
                 "--top-k", "1", "--steps", "2", "--warmup", "1", "--no-runs", "--format", "json",
                 cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (trial,) = json.loads(r.stdout)["trials"]
    assert trial["status"] == "ok", trial["reason"]
    (folder,) = (tmp_path / "autoplan-tune").glob("trial-1-*")
    assert (folder / "train.log").exists()
    if runner == "slurm":
        assert list(folder.glob("slurm-*.out"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autoplan-tune", "pids"]  # nothing beside


def test_a_launch_is_given_only_absolute_paths_for_a_relative_workdir():
    plan, trial = cpu_plan(), Trial()
    relative = Path("autoplan-tune") / "trial-1"
    for runner in (LaunchRunner("torchrun", "megatron"), LaunchRunner("torchrun", "torchtitan"),
                   LaunchRunner("slurm", "megatron"), LaunchRunner("slurm", "torchtitan")):
        cmd = runner.command(plan, trial, relative, runner.files(plan))
        paths = [a.split("=", 1)[-1] for a in cmd if "autoplan-tune" in a]
        assert paths and all(os.path.isabs(p) for p in paths), cmd
        # every path the launcher's environment names (megatron: its checkpoints; torchtitan:
        # its config, which its Slurm job reads)
        env = runner.environment(trial, relative)
        given = [v for k, v in env.items() if "autoplan-tune" in v and os.environ.get(k) != v]
        assert given and all(os.path.isabs(p) for p in given), env


def test_a_launch_flooding_its_log_is_stopped_at_its_timeout(standin, monkeypatch):
    # megabytes of the lines each poll re-parsed with backtracking patterns: a poll reads
    # only what is new, in bounded time, so the deadline holds
    monkeypatch.setenv("STANDIN_MODE", "flood")
    monkeypatch.setenv("STANDIN_FLOOD_MB", "24")
    trial = Trial(steps=3, warmup=1, timeout_s=1.0, workdir=standin / "t")
    started = time.monotonic()
    out = LaunchRunner(name="torchrun").run(cpu_plan(), trial, lambda _: None)
    took = time.monotonic() - started
    assert out.status == "timeout" and "--timeout" in out.reason, out.reason
    assert took < 1.0 + 6, took
    assert not alive(standin / "pids")
    assert len(out.reason) < 1000


def test_a_launch_logging_a_number_that_is_no_measurement_fails_naming_its_line(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "badnumber")
    trial = Trial(steps=3, warmup=1, timeout_s=60, workdir=standin / "t")
    out = LaunchRunner(name="torchrun").run(cpu_plan(), trial, lambda _: None)
    assert out.status == "failed"
    # line 1: the script's launching line; 2: building the model; 3: step 1; 4: its memory
    # report; 5: step 2
    assert "train.log line 5: elapsed time per iteration (ms)" in out.reason and "'1e308'" in out.reason
    assert not alive(standin / "pids")


def test_an_sbatch_that_prints_no_job_id_is_stopped_at_the_timeout(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_SBATCH", "silent")
    trial = Trial(steps=3, warmup=1, timeout_s=1.0, workdir=standin / "t")
    started = time.monotonic()
    out = LaunchRunner(name="slurm").run(cpu_plan(), trial, lambda _: None)
    assert out.status == "timeout" and "no job id" in out.reason, out.reason
    assert time.monotonic() - started < 1.0 + 6


def test_the_log_tail_a_failure_quotes_is_bounded_and_plain(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("x" * 100_000 + "\n\x1b[31mRuntimeError: NCCL error\x1b[0m\x07\n" + "y" * 5000)
    tail = _tail(log)
    assert "RuntimeError: NCCL error" in tail and "\x1b" not in tail and "\x07" not in tail
    assert len(tail) < 3 * (TAIL_LINE_CHARS + 10)


PATHOLOGICAL = {"torchtitan.log": "step: 1 loss: memory: 1GiB " * 800,
                "megatron.log": "iteration 1/1 | " * 40_000,
                "numbers.log": "".join(f" iteration {i}/ 3 | elapsed time per iteration (ms): {v} |\n"
                                       for i, v in enumerate(["...", "1.2.3", "inf"], start=1))}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_runs_import_of_a_hostile_log_is_refused_in_well_under_a_second(tmp_path, name):
    # the file ran past 60 s (the torchtitan pattern was cubic, Megatron-LM's
    # quadratic); numbers float() could not read raised a traceback
    log = tmp_path / name
    log.write_text(PATHOLOGICAL[name])
    runs = tmp_path / "r.csv"
    with cpu_seconds() as took:
        r = autoplan("runs", "import", log, "--plan", CPU / "plan-dp2.yaml", "--out", runs)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and name in r.stderr and len(r.stderr) < 2000
    assert took[0] < 1.0, took
    assert not runs.exists()
