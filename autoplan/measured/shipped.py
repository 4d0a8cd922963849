"""The profiles shipped under ``profiles/measured/``, looked up by the device descriptor
they were taken on (the ``descriptor`` line of a profile's header)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from autoplan import resources
from autoplan.errors import InputError
from autoplan.measured.profile import Profile, parse_profile

MEASURED_DIR = "measured"


@lru_cache(maxsize=64)
def _read_shipped(path: Path, mtime_ns: int) -> Profile:
    label = f"profiles/{MEASURED_DIR}/{path.name}"  # the same on every install
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError.single(label, "", f"cannot read file: {exc}") from None
    return parse_profile(text, label)


def shipped_profiles() -> list[Profile]:
    """The profiles shipped under ``profiles/measured/``, by file name."""
    folder = resources.profiles_dir() / MEASURED_DIR
    if not folder.is_dir():
        return []
    paths = sorted(p for p in folder.iterdir() if p.suffix == ".csv" and p.is_file())
    return [_read_shipped(p, p.stat().st_mtime_ns) for p in paths]


def shipped_profile(device_name: str) -> Profile | None:
    """The shipped profile taken on ``device_name`` (its ``descriptor`` header line); of
    several, the latest by ``date``, then by file name."""
    found = [p for p in shipped_profiles() if p.descriptor == device_name]
    return max(found, key=lambda p: (p.meta.get("date", ""), p.source)) if found else None
