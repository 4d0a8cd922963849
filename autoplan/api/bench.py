"""``bench``'s options as the library checks them, before minutes of measuring: the
descriptor's name, the preset, what a profile given to read is for, the models asked for,
and the machine ``--describe`` describes."""

from __future__ import annotations

from typing import Any

from autoplan.errors import InputError


def check_options(name: str, preset: str) -> None:
    """``--name`` (written into the descriptor, which must load again) and ``--preset``."""
    from autoplan.bench.presets import PRESET_NAMES
    from autoplan.descriptors.strict import name_problem, shown

    if name_problem(name):
        raise InputError.single("--name", "", str(name_problem(name)))
    if preset not in PRESET_NAMES:  # refused before minutes of measuring, not after the imports
        raise InputError.single("--preset", "", f"expected one of {', '.join(PRESET_NAMES)}, "
                                                f"got {shown(preset)}")


def check_profile_use(fit: bool, describe: object) -> None:
    """A profile given to read (``--profile``) is read for ``--fit`` or ``--describe``."""
    if not (fit or describe):
        raise InputError.single("--profile", "", "give --fit or --describe with a profile to read")


def model_names(model: str | None) -> list[str] | None:
    """``--model``'s comma-separated names or paths (None: the preset's)."""
    models = [m.strip() for m in model.split(",") if m.strip()] if model is not None else None
    if models == []:
        raise InputError.single("--model", "", "expected one or more model names or paths")
    return models


def check_describe(profile: Any) -> None:
    """``--describe`` describes a CPU profile's machine."""
    if profile.meta.get("device_kind") != "cpu":
        raise InputError.single("--describe", "", "describes a CPU profile's machine; for a GPU, use "
                                "its built-in device with --profile on search and evaluate")
