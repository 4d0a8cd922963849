"""Work run beside the caller in a forked process, where the platform forks.

The searches are CPU-bound pure Python: a second core helps only in a second process.
:func:`beside` forks one that inherits everything the caller has built (the search's
groups, its memos: nothing is pickled on the way in), runs a function there while the
caller goes on, and sends its result back pickled. Where the platform does not fork,
or the machine has one usable CPU, the function runs in the caller when its result is
asked (the answer is the same; only the wall time differs).

Forked children share this interpreter's hash seed, which the descriptors' cached hashes
rely on. A child ends with ``os._exit``: it runs none of the parent's exit handlers and
frees nothing object by object.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def usable_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether :func:`beside` runs its work in a second process here."""
    return "fork" in multiprocessing.get_all_start_methods() and usable_cpus() > 1


class Beside(Generic[T]):
    """The handle of :func:`beside`: :meth:`result` waits for the work and returns what
    it returned (or raises what it raised)."""

    def __init__(self, fn: Callable[[], T], fork: bool):
        self._fn: Callable[[], T] | None = fn
        self._pid = 0
        self._read = -1
        if fork:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child
                os.close(read)
                _child(fn, write)
            os.close(write)
            self._pid, self._read, self._fn = pid, read, None

    def result(self) -> T:
        if self._fn is not None:  # not forked: run here
            fn, self._fn = self._fn, None
            return fn()
        with os.fdopen(self._read, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        if not payload:
            raise RuntimeError(f"a forked search process ended without a result "
                               f"(wait status {status})")
        ok, value = pickle.loads(payload)
        if ok:
            return value  # type: ignore[no-any-return]
        if isinstance(value, BaseException):
            raise value
        raise RuntimeError(f"a forked search process failed:\n{value}")


def beside(fn: Callable[[], T]) -> Beside[T]:
    """Start ``fn`` in a forked process where :func:`can_fork` (else it runs when its
    result is asked); its result must pickle."""
    return Beside(fn, can_fork())


def _child(fn: Callable[[], object], write: int) -> None:
    """Run ``fn`` in the forked child and send (ok, result or error) down ``write``."""
    code = 0
    try:
        try:
            payload = pickle.dumps((True, fn()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # noqa: BLE001 -- every failure goes to the parent
            code = 1
            try:
                payload = pickle.dumps((False, exc), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 -- an exception that does not pickle
                payload = pickle.dumps((False, traceback.format_exc()))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(code)
