"""A serving engine's constants calibrated on the user's own measured runs: the file
``autoplan calibrate --out`` writes from serving runs (:mod:`autoplan.tune.serving_calibrate`),
and what ``serve`` and ``evaluate`` do with it (``--calibration FILE``): the plans of that
engine's release line are predicted with its constants in place of the engine file's
``FITTED`` entry (:func:`autoplan.serving.engine.fitted_as`), and each prediction's
evidence says so (``constants calibrated: ...``, ``serving.trust``).

The file (YAML; the comment lines above it say what it was fitted on and its held-out
error)::

    serving_calibration:
      engine: vllm                 # a registered engine
      line: 0.33.0                 # the release line it was fitted for (the runs' line)
      constants: {host_step_s: 0.003, host_seq_s: 2.0e-05, kernel_scale: 1.11,
                  launch_s: 6.0e-05, request_s: 0.0054}   # Fitted's, in seconds
      fitted: [host_step_s, kernel_scale, request_s]     # those the runs identified
      runs: 12                     # measured runs it was fitted on
      from: runs.csv               # the runs log

Every constant is held to the bounds calibrate searches (``BOUNDS``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import InputError, Problem
from autoplan.serving.engine import Engine, Fitted, fitted_as

KEY = "serving_calibration"
# the constants of a release line (serving.engine.Fitted's), in seconds but kernel_scale
CONSTANTS = ("host_step_s", "host_seq_s", "kernel_scale", "launch_s", "request_s")
# what a real engine can hold: a host step to 50 ms, 1 ms a sequence, kernels from a fifth
# to five times the roofline's time, 0.5 ms a kernel launch, 50 ms a request's front end
BOUNDS: dict[str, tuple[float, float]] = {
    "host_step_s": (0.0, 0.05),
    "host_seq_s": (0.0, 1e-3),
    "kernel_scale": (0.2, 5.0),
    "launch_s": (0.0, 5e-4),
    "request_s": (0.0, 0.05),
}


def with_constants(entry: Fitted, constants: dict[str, float], **rest: Any) -> Fitted:
    """``entry`` with ``constants`` (of ``CONSTANTS``; the others kept) and ``rest``."""
    c = {k: float(constants.get(k, getattr(entry, k))) for k in CONSTANTS}
    return dataclasses.replace(entry, host_step_s=c["host_step_s"], host_seq_s=c["host_seq_s"],
                               kernel_scale=c["kernel_scale"], launch_s=c["launch_s"],
                               request_s=c["request_s"], **rest)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """An engine release line's calibrated constants (module doc)."""

    engine: Engine
    line: str  # the release line (EngineVersion.version; "" for an engine without a table)
    constants: dict[str, float]
    fitted: tuple[str, ...] = ()
    runs: int = 0
    origin: str = ""  # the runs log it was fitted on
    path: str = ""  # the file it was read from ("" before it is written)

    @property
    def description(self) -> str:
        """What the constants were calibrated on, for the prediction's evidence."""
        where = f" ({self.path})" if self.path else ""
        return (f"on {self.runs} serving runs of {self.origin or 'a runs log'}{where}: "
                + (", ".join(f"{k} {self.constants[k]:.4g}" for k in self.fitted) or "none fitted"))

    def entry(self) -> Fitted:
        """The release line's ``FITTED`` entry with these constants (its other settings, the
        serial flag among them, as the line's own)."""
        base = self.engine.spec.at(self.line or None).fitted
        base = base if base is not None else Fitted(host_step_s=0.0, source="")
        return with_constants(base, self.constants, prior=False, calibration=self.description,
                              source=f"calibrated {self.description}")

    def why_not(self, engine: Engine, line: str) -> str | None:
        """Why these constants do not apply to a plan of ``engine`` at release line ``line``."""
        if engine is not self.engine:
            return f"calibrated for {self.engine.value}, not {engine.value}"
        if line != self.line:
            return (f"calibrated for {self.engine.value}'s release line {self.line}, the plan runs line "
                    f"{line or '-'}: calibrate runs of that line")
        return None

    def to_dict(self) -> dict[str, Any]:
        return {KEY: {"engine": self.engine.value, "line": self.line,
                      "constants": {k: self.constants[k] for k in CONSTANTS},
                      "fitted": list(self.fitted), "runs": self.runs, "from": self.origin}}


def read_calibration(path: Path, flag: str = "--calibration") -> Calibration:
    """The calibration file at ``path``; every problem named by file and field."""
    from autoplan.descriptors.strict import Fields, read_yaml

    data = read_yaml(path)
    source = str(path)
    problems: list[Problem] = []
    top = Fields(data, source, "", problems)
    body = top.child(KEY, top.raw(KEY))
    top.close()
    if problems:
        raise InputError(problems)
    name = body.str("engine")
    engine = None
    if name is not None:
        try:
            engine = Engine(name)
        except ValueError:
            body.fail("engine", f"expected one of {', '.join(e.value for e in Engine)}, got {name[:40]!r}")
    line = body.raw("line", "")
    line = str(line).strip() if line is not None else ""
    if engine is not None and line and all(v.version != line for v in engine.spec.lines):
        body.fail("line", f"expected a release line of {engine.value} "
                          f"({', '.join(v.version for v in engine.spec.lines)}), got {line[:40]!r}")
    consts = body.child("constants", body.raw("constants"))
    constants: dict[str, float] = {}
    for key in CONSTANTS:
        lo, hi = BOUNDS[key]
        value = consts.float(key, min=lo, max=hi)
        if value is not None:
            constants[key] = value
    consts.close()
    fitted = body.raw("fitted", [])
    if not isinstance(fitted, list) or any(f not in CONSTANTS for f in fitted):
        body.fail("fitted", f"expected a list of {', '.join(CONSTANTS)}")
        fitted = []
    runs = body.int("runs", 0, min=0, max=10**9)
    origin = body.str("from", "")
    body.close()
    if problems or engine is None:
        raise InputError(problems or [Problem(source, f"{KEY}.engine", "missing")])
    if not line and engine.spec.versions:
        raise InputError.single(source, f"{KEY}.line", "missing: the release line it was calibrated for")
    return Calibration(engine=engine, line=line, constants=constants, fitted=tuple(fitted), runs=runs or 0,
                       origin=origin or "", path=source)


def check(calibration: Calibration | None, plans: Sequence[Any], flag: str = "--calibration") -> None:
    """Refuse (exit 2, naming ``flag``) a calibration that applies to none of the plans'
    engine release lines: each plan must run its engine and line."""
    if calibration is None:
        return
    for plan in plans:
        why = calibration.why_not(plan.engine, plan.engine_line.version)
        if why:
            raise InputError.single(flag, "", f"{calibration.path}: {why}")


def check_engine(calibration: Calibration | None, engine: Engine, version: str | None,
                 flag: str = "--calibration") -> None:
    """:func:`check` for a search: the engine and release it searches."""
    if calibration is None:
        return
    why = calibration.why_not(engine, engine.spec.at(version).version)
    if why:
        raise InputError.single(flag, "", f"{calibration.path}: {why}")


@contextmanager
def applied(calibration: Calibration | None) -> Iterator[None]:
    """Predict with the calibrated constants (nothing changes for None)."""
    if calibration is None:
        yield
        return
    with fitted_as(calibration.engine, {calibration.line: calibration.entry()}):
        yield
