"""The profiles shipped under ``profiles/measured/``, looked up by the device descriptor
they were taken on (the ``descriptor`` line of a profile's header)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from autoplan import resources
from autoplan.descriptors.strict import read_limited
from autoplan.errors import InputError
from autoplan.measured.profile import MAX_PROFILE_BYTES, Profile, parse_profile, profile_header

MEASURED_DIR = "measured"


def _label(path: Path) -> str:
    return f"profiles/{MEASURED_DIR}/{path.name}"  # the same on every install


@lru_cache(maxsize=64)
def _read_shipped(path: Path, mtime_ns: int) -> Profile:
    data = read_limited(path, MAX_PROFILE_BYTES, "a profile CSV", label=_label(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError.single(_label(path), "", f"cannot read file: {exc}") from None
    return parse_profile(text, _label(path))


@lru_cache(maxsize=64)
def _descriptor(path: Path, mtime_ns: int) -> str | None:
    """The ``descriptor`` header line of a shipped profile, read without its rows."""
    try:
        with path.open(encoding="utf-8") as f:
            return profile_header(f).get("descriptor") or None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError.single(_label(path), "", f"cannot read file: {exc}") from None


def shipped_profile(device_name: str) -> Profile | None:
    """The shipped profile taken on ``device_name`` (its ``descriptor`` header line); of
    several, the latest by ``date``, then by file name. Only the matching files are parsed
    (pandas), so a device without a profile costs a look at each file's header."""
    folder = resources.profiles_dir() / MEASURED_DIR
    if not folder.is_dir():
        return None
    stamped = [(p, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())
               if p.suffix == ".csv" and p.is_file()]
    found = [_read_shipped(p, mtime) for p, mtime in stamped if _descriptor(p, mtime) == device_name]
    return max(found, key=lambda p: (p.meta.get("date", ""), p.source)) if found else None
