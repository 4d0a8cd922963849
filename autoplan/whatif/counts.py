"""GPU counts for a sweep: ``--gpus 256``, ``64,128,256`` or ``64..1024``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from autoplan.descriptors.library import MAX_GPUS
from autoplan.descriptors.strict import shown
from autoplan.errors import InputError

MAX_COUNTS = 16  # GPU counts in one sweep: each is a whole search

_RANGE = re.compile(r"^\s*(\d{1,12})\s*\.\.\s*(\d{1,12})\s*$")
_LIST = re.compile(r"^\s*\d{1,12}\s*(,\s*\d{1,12}\s*)*,?\s*$")


def parse_gpu_counts(text: str, source: str = "--gpus") -> tuple[int, ...]:
    """``"256"``, ``"64,128,256"`` or ``"64..1024"`` (doubling from the first up to the
    last: 64, 128, ..., 1024) -> ascending distinct counts."""
    if len(text) > 400:
        raise InputError.single(source, "", f"expected GPU counts, got {len(text)} characters")
    if m := _RANGE.match(text):
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo < 1 or hi < lo:
            raise InputError.single(source, "", f"expected A..B with 1 <= A <= B, got {shown(text)}")
        counts: list[int] = []
        n = lo
        while n <= hi and len(counts) <= MAX_COUNTS:
            counts.append(n)
            n *= 2
    elif _LIST.match(text):
        counts = [int(part) for part in text.split(",") if part.strip()]
    else:
        raise InputError.single(
            source, "", f"expected a GPU count (256), a list (64,128,256) or a doubling "
                        f"range (64..1024), got {shown(text)}")
    return check_gpu_counts(counts, source)


def check_gpu_counts(counts: Sequence[int], source: str, field: str = "") -> tuple[int, ...]:
    if len(counts) > MAX_COUNTS:
        raise InputError.single(source, field, f"expected at most {MAX_COUNTS} GPU counts "
                                               f"(each is a search), got {len(counts)}")
    for n in counts:
        if n < 1 or n > MAX_GPUS:
            raise InputError.single(source, field,
                                    f"expected GPU counts from 1 to {MAX_GPUS:,}, got {n:,}")
    return tuple(sorted(set(counts)))
