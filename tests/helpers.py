"""Small builders shared by tests, and the command line run in this process or in a new one."""

from __future__ import annotations

import gc
import importlib
import io
import os
import runpy
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autoplan.descriptors.job import Job
from autoplan.descriptors.library import builtin_stack, resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import Model
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.serving.engine import Engine, Fitted, fitted_as
from autoplan.vocab import NO_OFFLOAD, CpComm, Dtype, Offload, Recompute, ZeroStage


def make_plan(model: str | Model = "llama3-8b", cluster: str = "dgx-h100", gpus: int = 8,
              global_batch: int = 64, seq_len: int = 4096, dtype: Dtype = Dtype.BF16,
              dp: int = 8, tp: int = 1, pp: int = 1, cp: int = 1, vpp: int = 1,
              micro_batch: int = 1, schedule: Schedule = Schedule.ONE_F_ONE_B,
              recompute: Recompute = Recompute.NONE, zero: ZeroStage = ZeroStage.OPTIMIZER,
              sequence_parallel: bool = False, stages: tuple[int, ...] | None = None,
              ep: int = 1, etp: int | None = None, cp_comm: CpComm = CpComm.RING,
              moe_imbalance: float = 1.25, stack: str | None = None,
              offload: Offload = NO_OFFLOAD) -> Plan:
    extra: dict[str, Any] = {} if stack is None else {"stack": builtin_stack(stack)}
    if offload.any:
        extra["offload"] = offload
    return Plan(
        model=model if isinstance(model, Model) else resolve_model(model),
        cluster=with_gpus(resolve_cluster(cluster), gpus),
        job=Job(global_batch=global_batch, seq_len=seq_len, dtype=dtype,
                moe_imbalance=moe_imbalance),
        layout=Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, etp=etp),
        micro_batch=micro_batch, schedule=schedule, recompute=recompute, zero=zero,
        sequence_parallel=sequence_parallel, stages=stages, cp_comm=cp_comm, **extra,
    )


ROOT = Path(__file__).resolve().parent.parent


def _environ(changes: Mapping[str, str | None]) -> dict[str, str]:
    """This process's environment with ``changes`` applied (None removes a variable)."""
    env = dict(os.environ)
    _apply(env, changes)
    return env


def _apply(env: MutableMapping[str, str], changes: Mapping[str, str | None]) -> None:
    """Set each of ``changes`` in ``env``; None removes the variable."""
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value


def autoplan(*args: Any, cwd: Path | None = None,
             env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """``autoplan ARGS`` through its entry point, ``autoplan.cli.main:main``, in this process.

    Returns what :func:`autoplan_subprocess` returns for the same command: the exit status
    main() gives ``sys.exit``, everything written to stdout and stderr, and an uncaught
    exception as the interpreter reports it (a traceback on stderr, exit status 1). As there,
    the command runs from ``cwd`` (default: the repository root), never in debug mode, with
    ``env`` changed for the call (None removes a variable), and never on a terminal: stdout
    and stderr are in-memory text files, and the rich consoles of ``autoplan.cli.output``
    are made again on them, as a new process's import makes them on pipes (the ones made at
    the first import are bound to whatever ``sys.stdout`` was then, and are put back
    afterwards). Saves the interpreter start and the imports: about half a second a command.
    """
    from autoplan.cli import main as cli
    from autoplan.cli import output

    argv = ["autoplan", *(str(a) for a in args)]
    changes = {"AUTOPLAN_DEBUG": None, **(env or {})}
    saved_env = {key: os.environ.get(key) for key in changes}
    saved_consoles = dict(vars(output))

    def main() -> None:
        importlib.reload(output)  # the consoles made again on this call's stdout and stderr
        cli.main()

    try:
        _apply(os.environ, changes)
        return _as_main(argv, main, cwd or ROOT)
    finally:
        vars(output).update(saved_consoles)
        _apply(os.environ, saved_env)


def autoplan_subprocess(*args: Any, cwd: Path | None = None, env: Mapping[str, str | None] | None = None,
                        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m autoplan.cli.main ARGS`` in a new interpreter, as a user or a script runs it:
    from ``cwd`` (default: the repository root), never on a terminal, never in debug mode,
    with ``env`` changed for the call (None removes a variable). For what needs a real
    process: exit statuses, entry points, output that must not depend on the process."""
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", *(str(a) for a in args)],
                          capture_output=True, text=True, cwd=cwd or ROOT,
                          env=_environ({"AUTOPLAN_DEBUG": None, **(env or {})}),
                          timeout=timeout, check=False)


def _exit_status(exc: SystemExit) -> int:
    """The status an interpreter exits with for ``exc``: its code, 0 for None, and for
    sys.exit("message") the message on stderr and 1."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def run_script(script: Path, *args: Any, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` (a benchmark's command line) run in this process as its
    ``__main__``: what ``subprocess.run([sys.executable, SCRIPT, *ARGS], capture_output=True,
    text=True, cwd=cwd)`` returns, as :func:`autoplan` does for the command line (its exit
    status, stdout and stderr as in-memory text files, an uncaught exception as a traceback
    and exit 1, from ``cwd``, default the current folder), without the new interpreter and
    its imports (a second or more a run where the script loads scikit-learn). For scripts
    that read their arguments, print and exit; not for one whose point is a new process."""
    argv = [str(script), *(str(a) for a in args)]
    done = _as_main(argv, lambda: runpy.run_path(str(script), run_name="__main__"), cwd)
    return subprocess.CompletedProcess([sys.executable, *argv], done.returncode, done.stdout, done.stderr)


def _as_main(argv: list[str], main: Callable[[], object],
             cwd: Path | None) -> subprocess.CompletedProcess[str]:
    """``main()`` run as a new process's main would run: with ``sys.argv`` = ``argv``, from
    ``cwd`` (None: the current folder), stdout and stderr in-memory text files; its exit
    status as the interpreter gives a ``SystemExit`` (:func:`_exit_status`), an uncaught
    exception a traceback on stderr and 1. The interpreter's state is put back after."""
    saved = sys.argv, sys.stdout, sys.stderr, os.getcwd()
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.argv, sys.stdout, sys.stderr = argv, stdout, stderr
        try:
            main()
        except SystemExit as exc:
            code = _exit_status(exc)
        except Exception:
            traceback.print_exc()
            code = 1
    finally:
        sys.argv, sys.stdout, sys.stderr = saved[:3]
        os.chdir(saved[3])
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())

REPO = Path(__file__).resolve().parents[1]

# ---- plans shared by the check/diff tests (library and command line)
PLANS = REPO / "examples" / "plans"
BEST = PLANS / "llama3-8b-64xh100-megatron-best.yaml"  # the search's best in the megatron space
OOM = PLANS / "llama3-70b-256xh100-oom.yaml"
SLOW = PLANS / "llama3-8b-8xh100-slow.yaml"
ONE_F_ONE_B = PLANS / "llama3-8b-32xh100-1f1b.yaml"
ZB_V = PLANS / "llama3-8b-32xh100-zbv.yaml"  # the same plan with the zb-v schedule

MALFORMED = """\
autoplan: 1
model: llama3-8b
cluster: {name: dgx-h100, nodes: 1}
job: {global_batch: 64, seq_len: 4096, dtype: bf16}
layout: {dp: 8, tp: eight, pp: 1}
micro_batch: 1
schedul: 1f1b
"""

NOT_DIVISIBLE = """\
autoplan: 1
model: llama3-8b
cluster: {name: dgx-h100, nodes: 1}
job: {global_batch: 64, seq_len: 4096, dtype: bf16}
layout: {dp: 2, tp: 4, pp: 1}
micro_batch: 3
"""


@contextmanager
def cpu_seconds() -> Iterator[list[float]]:
    """This process's CPU seconds in the block (``with cpu_seconds() as t: ...; t[0]``),
    for the reject paths' "fails fast" checks: CPU time, not wall clock, so that other jobs
    sharing the machine cannot fail them; the objects earlier tests left behind frozen first
    (``gc.freeze``: the collector skips them until ``gc.unfreeze`` after the block), so
    that a full garbage collection over them cannot land in the block. Not collected first:
    freezing alone keeps them out of the block, and a full collection here, over a worker
    that has imported torch and the launchers, costs more than the refusals it times
    (0.2 to 1 s a call, most of the reject tests' time)."""
    gc.freeze()
    took = [0.0]
    start = time.process_time()
    try:
        yield took
    finally:
        took[0] = time.process_time() - start
        gc.unfreeze()


@contextmanager
def engine_constants(engine: Engine, line: str | None = None, **constants: Any) -> Iterator[None]:
    """Run with ``engine``'s release ``line`` (None: its default line) predicted with a test's
    own constants (``Fitted``'s fields; the rest at their defaults: no front end, the line's
    overlap applied unless ``serial=True``), whatever the engine file's shipped ``FITTED``
    holds: a test of a mechanism keeps its numbers when the engines are fitted again
    (:func:`autoplan.serving.engine.fitted_as`: the spec restored after, the caches cleared)."""
    if line is None:
        default = engine.spec.default_line
        line = default.fitted_line or default.version
    with fitted_as(engine, {line: Fitted(source="a test's constants", **constants)}):
        yield


def run_launch_script(script: str, tmp_path: Path, command: list[str], **env: str) -> list[str]:
    """The arguments a launch script hands ``command`` (its program and the leading words
    it always gets, e.g. ``["python", "-m", "sglang.launch_server"]``): the script run by
    bash (MODEL=m) with a stand-in program on PATH that prints its arguments one per line;
    the leading words checked and dropped."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    stub = stubs / command[0]
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    path = tmp_path / "launch.sh"
    path.write_text(script)
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{stubs}:{os.environ['PATH']}", "MODEL": "m", **env})
    assert done.returncode == 0, done.stderr
    argv = done.stdout.splitlines()
    lead = len(command) - 1
    assert argv[:lead] == command[1:]
    return argv[lead:]
