"""The profiles shipped under ``profiles/measured/``, looked up by the device descriptor
they were taken on (the ``descriptor`` line of a profile's header) and, for a serving
engine's kernels, the engine and its version (``engine``, ``engine_version``).

Which one (:func:`shipped_profile`):

- no engine asked (training): of the profiles without an ``engine`` line (``autoplan
  bench``'s), the latest by ``date``, then by file name;
- an engine asked (serving): of the profiles of that engine, the newest version not after
  the one asked (:func:`version_key`), else the engine's newest where the release asked is
  of the same major version (no version asked: its newest); a release of an older major
  version (TensorRT-LLM 0.17 against tables of 1.3: other kernels) and a device without a
  profile of the engine fall back to the engine-less rule.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

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


@lru_cache(maxsize=256)
def _header(path: Path, mtime_ns: int) -> dict[str, str]:
    """The header lines of a shipped profile, read without its rows."""
    try:
        with path.open(encoding="utf-8") as f:
            return profile_header(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError.single(_label(path), "", f"cannot read file: {exc}") from None


_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[.-]?(dev|a|b|rc|post)\.?(\d*))?(.*)$", re.IGNORECASE)
_TAG_RANK = {"dev": -4, "a": -3, "b": -2, "rc": -1, "": 0, "post": 1}


def version_key(version: str) -> tuple[Any, ...]:
    """A sort key of an engine or NCCL version as their releases are numbered:
    ``1.3.0rc20`` < ``1.3.0`` < ``1.3.0.post1``, ``0.5.6.post2`` < ``0.5.9`` < ``0.5.14``
    (PEP 440's order for the spellings the engines use); text it cannot read sorts first."""
    m = _VERSION.match(version.strip())
    if m is None:
        return ((-1,), 0, 0, version)
    release = tuple(int(x) for x in m.group(1).split("."))
    release = release + (0,) * (4 - len(release))
    tag = (m.group(2) or "").lower()
    return (release, _TAG_RANK[tag], int(m.group(3) or 0), m.group(4))


def _pick_version(found: list[tuple[Path, int, str]], version: str | None) -> tuple[Path, int] | None:
    """Of an engine's profiles (path, mtime, engine version): the newest version not after
    ``version``, else the newest of the same major version, else None (module doc); file
    name breaks ties."""
    ranked = sorted(found, key=lambda f: (version_key(f[2]), f[0].name))
    if version is not None and not version.strip().lower().startswith("nightly"):  # a nightly: the newest
        asked = version_key(version)
        before = [f for f in ranked if version_key(f[2]) <= asked]
        ranked = before or [f for f in ranked if version_key(f[2])[0][:1] == asked[0][:1]]
    if not ranked:
        return None
    path, mtime, _ = ranked[-1]
    return path, mtime


def shipped_profile(device_name: str, engine: str | None = None,
                    version: str | None = None) -> Profile | None:
    """The shipped profile for ``device_name`` (its ``descriptor`` header line), and for
    ``engine`` at ``version`` where asked: the module doc's rule. Only the chosen file is
    parsed (pandas), so a device without a profile costs a look at each file's header."""
    folder = resources.profiles_dir() / MEASURED_DIR
    if not folder.is_dir():
        return None
    stamped = [(p, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())
               if p.suffix == ".csv" and p.is_file()]
    headers = [(p, mtime, _header(p, mtime)) for p, mtime in stamped]
    mine = [(p, mtime, h) for p, mtime, h in headers if (h.get("descriptor") or None) == device_name]
    if engine is not None:
        of_engine = [(p, mtime, h.get("engine_version", "")) for p, mtime, h in mine
                     if h.get("engine") == engine]
        picked = _pick_version(of_engine, version) if of_engine else None
        if picked is not None:
            return _read_shipped(*picked)
    found = [_read_shipped(p, mtime) for p, mtime, h in mine if not h.get("engine")]
    return max(found, key=lambda p: (p.meta.get("date", ""), p.source)) if found else None
