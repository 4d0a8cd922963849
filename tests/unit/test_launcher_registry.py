"""The launcher and runner registries (issue 48): a training launcher is one module of
``autoplan.export`` (``LAUNCHER = LauncherSpec(...)``), a tune runner one
``autoplan/tune/runner_<name>.py`` (``RUNNER = RunnerSpec(...)``), each found by looking.

The fake launcher and the fake runner below are each written as one file into a folder of
the test's own, put on the package's ``__path__`` (the import system's search path for the
package's modules) and found; ``autoplan export --to`` and ``launchers()``, or ``autoplan
tune --runner``, take them from there, and they are gone after the test (the folder off
the path, the registry looked at again). The built-in launchers' specs are complete: their
space file and stack exist and agree, their exporter writes a plan their own space's
search found, their Slurm program and tune launch work."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import autoplan.cli.main  # noqa: F401  (its --to choices read before a fake registers: they must not keep it)
import autoplan.export as export_package
import autoplan.tune as tune_package
from autoplan import caches
from autoplan.descriptors.library import resolve_stack
from autoplan.descriptors.space import load_space
from autoplan.descriptors.strict import read_yaml
from autoplan.export import Launcher, Target, export, launchers, refusals
from autoplan.export.launcher import get, names, refresh, space_file, specs
from autoplan.kernels.memory import default_headroom_bytes
from autoplan.plans.file import read_plan
from autoplan.search.engine import search
from autoplan.serving.engine import Engine
from autoplan.tune.logs import FORMATS
from autoplan.tune.runners import get_runner, refresh_runners, runner_names, runner_specs
from autoplan.vocab import Dtype, ZeroStage
from tests.helpers import BEST, REPO, autoplan, make_plan

BUILT_IN = ("megatron", "nemo", "deepspeed", "torchtitan", "accelerate")
RUNNERS = ("local", "torchrun", "slurm")

FAKE_LAUNCHER = '''"""A launcher of the test suite's own: everything it is, in this one file."""
from autoplan.export.launcher import LauncherSpec
from autoplan.vocab import Dtype


def export(plan):
    return {"fake.toml": f"dp = {plan.layout.dp}\\ntp = {plan.layout.tp}\\n",
            "run-fake.sh": "#!/usr/bin/env bash\\nfake-train --config fake.toml\\n"}


def problems(plan):
    if plan.job.dtype is not Dtype.BF16:
        return [("job.dtype", "fake trains in bf16 only")]
    return []


LAUNCHER = LauncherSpec(name="fake", summary="a fake launcher", space="megatron",
                        stack="megatron-core", export=export, source="tests", problems=problems)
'''

FAKE_RUNNER = '''"""A runner of the test suite's own: everything it is, in this one file."""
from autoplan.tune.runners import Outcome, RunnerSpec


class FakeRunner:
    name = "fake"

    def refuses(self, plan):
        return None if plan.layout.tp == 1 else "the fake runner runs no tensor parallelism"

    def run(self, plan, trial, progress):
        step = 0.25 * plan.layout.pp
        return Outcome(status="ok", step_time_s=step, step_times_s=(step,) * trial.steps, peak_gib=1.0)


RUNNER = RunnerSpec(name="fake", summary="measures 0.25 s a step per pipeline stage", startup_s=1.0,
                    make=lambda device, launcher: FakeRunner())
'''


@contextlib.contextmanager
def one_file(package: Any, folder: Path, name: str, text: str,
             look: Callable[[], Any]) -> Iterator[Path]:
    """``folder/name`` holding ``text``, on ``package``'s search path and found by ``look``
    while the block runs; off it, out of ``sys.modules`` and forgotten after."""
    folder.mkdir()
    (folder / name).write_text(text, encoding="utf-8")
    module = f"{package.__name__}.{name.removesuffix('.py')}"
    old = package.__path__
    package.__path__ = [*old, str(folder)]
    try:
        look()
        yield folder
    finally:
        package.__path__ = old
        sys.modules.pop(module, None)
        look()
        caches.clear()


def files_in(folder: Path) -> list[str]:
    """The files the fake needed (Python's own cache aside)."""
    return sorted(p.name for p in folder.iterdir() if p.name != "__pycache__")


# --------------------------------------------------------------------------- a fake launcher


def test_a_launcher_is_one_file_that_export_and_launchers_take_and_forget_after(tmp_path: Path) -> None:
    plan_path = BEST  # the megatron space's best: a plan the fake (megatron's rules) runs
    out = tmp_path / "out"
    with one_file(export_package, tmp_path / "launchers", "fake.py", FAKE_LAUNCHER, refresh) as folder:
        assert files_in(folder) == ["fake.py"]  # the one file a launcher needs
        assert names() == (*BUILT_IN, "fake")  # after the built-in ones (order 100, then by name)
        assert Target.FAKE == "fake" and Target("fake").spec is get("fake")
        r = autoplan("export", plan_path, "--to", "fake", "--out", out)
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in out.iterdir()) == ["fake.toml", "run-fake.sh"]
        assert (out / "fake.toml").read_text() == "dp = 32\ntp = 1\n"
        assert os.stat(out / "run-fake.sh").st_mode & stat.S_IXUSR  # scripts are executable
        plan = read_plan(read_yaml(plan_path), str(plan_path))
        assert "fake" in launchers(plan)
        fp16 = dataclasses.replace(plan, job=dataclasses.replace(plan.job, dtype=Dtype.FP16))
        assert "fake" not in launchers(fp16)
        assert ("job.dtype", "fake trains in bf16 only") in refusals(fp16, "fake")
        # its space's rules, and its refusals named as the others' are
        zero3 = REPO / "examples" / "plans" / "llama3-8b-32xh100-zbh2-torchtitan.yaml"
        refused = autoplan("export", zero3, "--to", "fake")
        assert refused.returncode == 2
        assert "cannot export to fake: megatron cannot run the zb-h2 schedule" in refused.stderr
        assert "`autoplan search --space megatron` searches only plans fake can run" in refused.stderr
        # no Slurm program: a Slurm job does not run it
        slurm = autoplan("export", plan_path, "--to", "slurm", "--launcher", "fake")
        assert slurm.returncode == 2 and "--launcher: expected one of megatron, deepspeed, torchtitan" \
            in slurm.stderr
    assert names() == BUILT_IN
    assert "fake" not in Target and "autoplan.export.fake" not in sys.modules
    with pytest.raises(ValueError, match="not a training export target"):
        Target("fake")


def test_the_registry_holds_the_built_in_launchers_in_order_and_refuses_an_unknown_name() -> None:
    assert names() == BUILT_IN
    assert [s.name for s in specs()] == list(BUILT_IN)
    assert [t.value for t in Target] == [*BUILT_IN, "slurm"]
    assert [launcher.value for launcher in Launcher] == ["megatron", "deepspeed", "torchtitan"]
    assert [(s.name, s.space) for s in specs()] == [
        ("megatron", "megatron"), ("nemo", "megatron"), ("deepspeed", "deepspeed"),
        ("torchtitan", "torchtitan"), ("accelerate", "fsdp")]
    from autoplan.errors import InputError

    with pytest.raises(InputError, match="--launcher: unknown launcher 'megatorn'; known: megatron, nemo, "
                                         "deepspeed, torchtitan, accelerate"):
        get("megatorn")


def test_the_same_target_objects_survive_a_second_look() -> None:
    before = Target.MEGATRON
    refresh()
    assert Target.MEGATRON is before and Launcher("torchtitan") is Launcher.TORCHTITAN


# --------------------------------------------------------------------------- a fake runner

CPU = REPO / "examples" / "cpu"
SEARCH = ("--model", CPU / "tiny-llama.yaml", "--cluster", CPU / "local-cpu.yaml", "--gpus", "2",
          "--global-batch", "8", "--seq-len", "256")


def test_a_runner_is_one_file_that_tune_takes_and_forgets_after(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    with one_file(tune_package, tmp_path / "runners", "runner_fake.py", FAKE_RUNNER,
                  refresh_runners) as folder:
        assert files_in(folder) == ["runner_fake.py"]  # the one file a runner needs
        assert runner_names() == (*RUNNERS, "fake")
        r = autoplan("tune", *SEARCH, "--runner", "fake", "--top", "2", "--steps", "2", "--warmup", "1",
                     "--runs", runs, "--format", "json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["trials"] and all(t["status"] == "ok" for t in doc["trials"])
        for t in doc["trials"]:
            assert t["measured"]["step_time_s"] == 0.25 * t["plan"]["layout"]["pp"]
            assert t["plan"]["layout"]["tp"] == 1
        assert all("no tensor parallelism" in s["reason"] for s in doc["skipped"])
        with open(runs, newline="") as f:  # the runs log names the runner
            assert [row["runner"] for row in csv.DictReader(f)] == ["fake"] * len(doc["trials"])
        assert not (tmp_path / "autoplan-tune").exists()  # no launch: no workdir
    assert runner_names() == RUNNERS and "autoplan.tune.runner_fake" not in sys.modules
    gone = autoplan("tune", *SEARCH, "--runner", "fake", "--no-runs", cwd=tmp_path)
    assert gone.returncode == 2
    assert "--runner: expected one of local, torchrun, slurm, got 'fake'" in gone.stderr


def test_tune_refuses_a_launcher_its_runner_does_not_launch(tmp_path: Path) -> None:
    r = autoplan("tune", *SEARCH, "--runner", "torchrun", "--launcher", "deepspeed", "--no-runs",
                 cwd=tmp_path)
    assert r.returncode == 2 and "--launcher: expected one of megatron, torchtitan, got 'deepspeed'" \
        in r.stderr


def test_the_built_in_runners_are_local_torchrun_and_slurm_with_their_help() -> None:
    from autoplan.cli.commands.tune import LAUNCHER_HELP, LAUNCHER_METAVAR, RUNNER_HELP, RUNNER_METAVAR

    assert runner_names() == RUNNERS
    assert RUNNER_METAVAR == "<local|torchrun|slurm>" and LAUNCHER_METAVAR == "<megatron|torchtitan>"
    assert RUNNER_HELP.startswith("local: this machine's devices") and "slurm: the exported sbatch job" \
        in RUNNER_HELP
    assert LAUNCHER_HELP == ("torchrun and slurm runners: megatron (Megatron-LM's pretrain_gpt.py; set "
                             "MEGATRON_LM) or torchtitan.")
    assert [r.name for r in runner_specs() if r.launches] == ["torchrun", "slurm"]
    assert get_runner("slurm").batch is not None and get_runner("torchrun").batch is None


# --------------------------------------------------------------------------- the built-in launchers


@pytest.fixture(scope="module")
def accepted() -> dict[str, Any]:
    """Each launcher's best plan of its own space's search (llama3-8b on 8 H100): a plan
    the launcher accepts by construction of the space, whatever the launcher."""
    base = make_plan()
    headroom = default_headroom_bytes(base.cluster.device.mem_bytes)
    out = {}
    for spec in specs():
        found = search(base.model, base.cluster, base.job, load_space(spec.space), 1, headroom)
        out[spec.name] = found.plans[0].plan
    return out


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_launcher_spec_is_complete(name: str, accepted: dict[str, Any],
                                                  tmp_path: Path) -> None:
    spec = get(name)
    assert spec.summary and spec.source and spec.attr == name.upper()
    assert name not in {e.value for e in Engine} and name != "slurm"  # export --to is one namespace
    assert space_file(spec).is_file()
    assert load_space(spec.space).stack.name == spec.stack == resolve_stack(spec.stack).name
    plan = accepted[name]
    assert refusals(plan, name) == [] and name in launchers(plan)
    files = export(plan, name, "p.yaml")
    assert files and all(text.strip() for text in files.values())
    for script in (f for f in files if f.endswith((".sh", ".sbatch"))):
        (tmp_path / script).write_text(files[script])
        assert subprocess.run(["bash", "-n", str(tmp_path / script)], check=False).returncode == 0
    if spec.slurm is not None:
        job = export(plan, "slurm", "p.yaml", name)
        assert "job.sbatch" in job and "srun --kill-on-bad-exit=1 torchrun" in job["job.sbatch"]
    if spec.tune is not None:
        assert spec.tune.log_format in FORMATS
        workdir = tmp_path / "trial"
        command = spec.tune.command(plan, 4, workdir)
        assert command and all(isinstance(w, str) for w in command)
        env = spec.tune.environment(4, workdir)
        assert all(os.path.isabs(v) for v in env.values() if str(workdir) in v)


def test_the_features_beyond_the_space_rules_are_run_only_by_the_megatron_core_launchers() -> None:
    from autoplan.vocab import Recompute, RecomputeModule, StateDtype

    plan = make_plan(dp=8, zero=ZeroStage.OPTIMIZER, recompute=Recompute.SELECTIVE)
    modules = dataclasses.replace(plan, recompute_modules=(RecomputeModule.CORE_ATTN, RecomputeModule.MLP))
    assert [n for n in names() if not dict(refusals(modules, n)).get("recompute_modules")] \
        == ["megatron", "nemo"]
    grads = dataclasses.replace(plan, job=dataclasses.replace(plan.job, main_grads=StateDtype.BF16))
    assert [n for n in names() if not dict(refusals(grads, n)).get("job.main_grads")] == ["megatron", "nemo"]
    states = dataclasses.replace(plan, job=dataclasses.replace(plan.job, optimizer_states=StateDtype.BF16))
    takes = [n for n in names() if not dict(refusals(states, n)).get("job.optimizer_states")]
    assert takes == ["megatron", "nemo"]
    # int16 master remainders: the precision-aware optimizer's (Megatron-LM, Bridge) and NeMo
    # 1.x's; no master at all: NeMo 1.x's distributed_fused_adam only (the nemo-1 stack)
    from autoplan.descriptors.library import builtin_stack
    from autoplan.vocab import MasterWeights

    def master(p: Any, m: MasterWeights) -> Any:
        return dataclasses.replace(p, job=dataclasses.replace(p.job, master_weights=m))

    rem = master(plan, MasterWeights.REMAINDERS)
    assert [n for n in names() if not dict(refusals(rem, n)).get("job.master_weights")] == \
        ["megatron", "nemo"]
    none = master(plan, MasterWeights.NONE)
    assert [n for n in names() if not dict(refusals(none, n)).get("job.master_weights")] == []
    recipe = dataclasses.replace(none, stack=builtin_stack("nemo-1"), job=dataclasses.replace(
        none.job, main_grads=StateDtype.BF16, optimizer_states=StateDtype.BF16))
    assert [n for n in names() if not refusals(recipe, n)] == ["nemo"]


def test_a_space_file_named_like_a_built_in_that_names_no_stack_runs_on_the_built_ins(tmp_path: Path) -> None:
    """The stack is the space file's ``stack:`` (each built-in names its launcher's); a copy
    of a built-in space from before they named one keeps the stack it ran on."""
    from autoplan.descriptors.space import read_space

    raw = yaml.safe_load((REPO / "searchspace" / "torchtitan.yaml").read_text())
    del raw["searchspace"]["stack"]
    assert read_space(raw, str(tmp_path / "mine.yaml")).stack.name == "torchtitan"
    raw["searchspace"]["name"] = "mine"
    assert read_space(raw, str(tmp_path / "mine.yaml")).stack.name == "megatron-core"  # the default
