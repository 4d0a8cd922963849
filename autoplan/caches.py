"""One owner for every memoized cost.

Costs are pure functions of frozen descriptors and plans, memoized with :func:`memo` (a
``functools.lru_cache`` that registers itself here). A search, an evaluation or a sweep
runs in a :func:`scope`: the outermost scope owns every memo while it runs (the
candidates of one search share their layers' costs) and drops them all when it ends,
so nothing computed for one question outlives it: memory stays bounded however many
searches a process runs (a test session, a notebook), and a cold run is the default,
not a list of caches to remember.

Caches of files read (descriptors, shipped profiles, fitted forests) are not costs: they
key on the file and stay (``descriptors.library``, ``measured``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_OWNED: list[functools._lru_cache_wrapper[Any]] = []
_depth = 0


def memo(maxsize: int) -> Callable[[Callable[..., T]], functools._lru_cache_wrapper[T]]:
    """``functools.lru_cache(maxsize)``, owned here: :func:`clear` and the end of the
    outermost :func:`scope` drop it."""

    def wrap(fn: Callable[..., T]) -> functools._lru_cache_wrapper[T]:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _OWNED.append(cached)
        return cached

    return wrap


def clear() -> None:
    """Drop every memoized cost (benchmarks: cold runs)."""
    for cached in _OWNED:
        cached.cache_clear()


@contextmanager
def scope() -> Iterator[None]:
    """Run a search, an evaluation or a sweep: memos are shared inside, dropped when the
    outermost scope ends (a scope inside another leaves them to it)."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            clear()


def owned() -> int:
    """Entries held in every owned memo (what a scope's end frees)."""
    return sum(cached.cache_info().currsize for cached in _OWNED)
