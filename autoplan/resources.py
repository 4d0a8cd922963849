"""Where the shipped data lives: ``profiles/`` and ``searchspace/``.

In a source checkout (and an editable install) they sit at the top of the
repository; a wheel ships them as ``autoplan/_data/`` (see pyproject.toml).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path


@cache
def data_root() -> Path:
    packaged = Path(str(resources.files("autoplan"))) / "_data"
    if (packaged / "profiles").is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent
    assert (checkout / "profiles").is_dir(), f"autoplan data not found under {packaged} or {checkout}"
    return checkout


def profiles_dir() -> Path:
    return data_root() / "profiles"


def searchspace_dir() -> Path:
    return data_root() / "searchspace"
