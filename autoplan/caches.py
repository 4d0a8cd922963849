"""One owner for every memoized cost.

Costs are pure functions of frozen descriptors and plans, memoized with :func:`memo` (a
``functools.lru_cache`` that registers itself here). A search, an evaluation or a sweep
runs in a :func:`scope`: the outermost scope owns every memo while it runs (the
candidates of one search share their layers' costs) and starts by dropping what the last
question left, so nothing computed for one question is used by the next: memory stays
bounded however many searches a process runs (a test session, a notebook: one question's
memos at most), and a cold run is the default, not a list of caches to remember. (They
are dropped when the next question starts rather than when this one ends: a command that
answers one question and exits does not spend its last tenths of a second freeing them.)

Caches of files read (descriptors, shipped profiles, fitted forests) are not costs: they
key on the file and stay (``descriptors.library``, ``measured``).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_OWNED: list[functools._lru_cache_wrapper[Any]] = []
_depth = 0


def memo(maxsize: int) -> Callable[[Callable[..., T]], functools._lru_cache_wrapper[T]]:
    """``functools.lru_cache(maxsize)``, owned here: :func:`clear` and the start of an
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
    """Run a search, an evaluation or a sweep: an outermost scope starts from no memo and
    its memos are shared inside it (a scope inside another shares its outer one's)."""
    global _depth
    if _depth == 0:
        clear()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def owned() -> int:
    """Entries held in every owned memo (what the next outermost scope drops)."""
    return sum(cached.cache_info().currsize for cached in _OWNED)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run with Python's cyclic garbage collector paused (and restored after, as it was).
    A search builds millions of short-lived acyclic plans and stage works, which reference
    counting frees; the collector's passes would traverse them and every memo held here
    again and again (a third of the README's pooled search; 0.4 s of the 16 searches of a
    DeepSeek-V3 sweep, between its searches, measured).

    What survives the block (the answer, the memos the next question drops) has not been
    seen by the collector: the first collection after it would traverse all of it as young
    (0.25 s after that sweep). It is moved to the oldest generation unscanned instead
    (``gc.freeze`` then ``gc.unfreeze``, where nothing else is frozen), which the
    collector traverses only when that generation has grown by a quarter."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
