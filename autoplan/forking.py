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

import functools
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Generic, NoReturn, TypeVar

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

    def abandon(self) -> None:
        """Stop the work where it runs in a child (the caller failed: its result is not
        wanted), and reap the child."""
        if self._pid:
            _stop(self._pid)
            os.close(self._read)
            self._pid, self._fn = 0, None

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
        if not ok:
            _raise(value)
        return value  # type: ignore[no-any-return]


def beside(fn: Callable[[], T]) -> Beside[T]:
    """Start ``fn`` in a forked process where :func:`can_fork` (else it runs when its
    result is asked); its result must pickle."""
    return Beside(fn, can_fork())


def _child(fn: Callable[[], object], write: int) -> None:
    """Run ``fn`` in the forked child and send (ok, result or error) down ``write``."""
    ok = False
    try:
        payload, ok = _outcome(fn)
        with os.fdopen(write, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(0 if ok else 1)


def _outcome(fn: Callable[[], object], *head: object) -> tuple[bytes, bool]:
    """``fn()`` run, and (ok, *head, its result or the failure it ended in) pickled for
    the parent; whether it ran to its end. Every failure goes to the parent; one that
    does not pickle goes as its traceback's text."""
    try:
        return pickle.dumps((True, *head, fn()), protocol=pickle.HIGHEST_PROTOCOL), True
    except BaseException as exc:  # noqa: BLE001
        try:
            return pickle.dumps((False, *head, exc), protocol=pickle.HIGHEST_PROTOCOL), False
        except Exception:  # noqa: BLE001
            return pickle.dumps((False, *head, traceback.format_exc())), False


def _raise(failure: BaseException | str) -> NoReturn:
    """Raise in the parent what a child's work ended in (:func:`_outcome`)."""
    if isinstance(failure, BaseException):
        raise failure
    raise RuntimeError(f"a forked search process failed:\n{failure}")


def dealt_to(tasks: int, workers: int | None = None) -> int:
    """The processes :func:`deal` runs ``tasks`` tasks in, asked for ``workers``."""
    if not can_fork():
        return 1
    return max(1, min(usable_cpus() if workers is None else workers, tasks))


def deal(order: Sequence[int], work: Callable[[int], T],
         told: Callable[[int, T], None] | None = None, workers: int | None = None,
         ended: Callable[[], None] | None = None, last: Sequence[int] = ()) -> dict[int, T]:
    """``work(i)`` for every ``i`` of ``order``, then of ``last``, in up to ``workers``
    processes (None: one per usable CPU; this one and forked children): the first takes
    tasks from the front of ``order``, the second from the back, and so on alternately,
    each its next as it finishes one, until they meet; then each the next of ``last`` as
    it finishes one. Ordered by size, the tasks each process runs are neighbours (their
    memos serve each other) and the two ends balance as they go; short tasks in ``last``
    fill the wait of those ending first for the others. ``told(i, result)`` as each ends
    (from this process, in any order); ``ended()`` in this process as each forked one
    ends, however it ends (tasks that wait on another's result can be let go where that
    one failed). Where :func:`can_fork` is false, or one worker is asked, they run here
    in ``order``, then ``last``."""
    tasks = len(order) + len(last)
    workers = dealt_to(tasks, workers)
    out: dict[int, T] = {}
    if workers == 1:
        for i in (*order, *last):
            out[i] = work(i)
            if told is not None:
                told(i, out[i])
        return out
    ctx = multiprocessing.get_context("fork")
    # the next from the front; one past the next from the back; the next of ``last``
    ends = ctx.RawArray("i", [0, len(order), 0])
    lock = ctx.Lock()

    def take(front: bool) -> int | None:
        with lock:
            lo, hi = ends[0], ends[1]
            if lo >= hi:
                if ends[2] >= len(last):
                    return None
                ends[2] += 1
                return last[ends[2] - 1]
            if front:
                ends[0] = lo + 1
                return order[lo]
            ends[1] = hi - 1
            return order[hi - 1]

    children: list[tuple[int, int]] = []
    for w in range(1, workers):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its tasks' results down the pipe, one message each
            os.close(read)
            _worker(functools.partial(take, w % 2 == 0), work, write)
        os.close(write)
        children.append((pid, read))
    guard = threading.Lock()
    failures: list[BaseException | str] = []

    def record(i: int, result: T) -> None:
        with guard:
            out[i] = result
            if told is not None:
                told(i, result)

    def listen(read: int) -> None:
        try:
            with os.fdopen(read, "rb") as pipe:
                while header := pipe.read(8):
                    ok, task, value = pickle.loads(pipe.read(int.from_bytes(header, "little")))
                    if ok:
                        record(task, value)
                    else:
                        failures.append(value)
        finally:
            if ended is not None:
                ended()

    listeners = [threading.Thread(target=listen, args=(read,), daemon=True) for _, read in children]
    for t in listeners:
        t.start()
    try:
        while (task := take(True)) is not None:
            record(task, work(task))
    except BaseException:
        for pid, _ in children:  # this process failed: the others' tasks are not wanted
            _stop(pid)
        for t in listeners:
            t.join()
        raise
    for t in listeners:
        t.join()
    for pid, _ in children:
        os.waitpid(pid, 0)
    for failure in failures:
        _raise(failure)
    missing = [i for i in order if i not in out]
    if missing:
        raise RuntimeError(f"forked search processes ended without {len(missing)} of their results")
    return out


def _stop(pid: int) -> None:
    """Kill a forked child and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _worker(take: Callable[[], int | None], work: Callable[[int], object], write: int) -> None:
    """A child of :func:`deal`: runs the tasks ``take`` gives until there are none, each
    result (or the failure that ends it) sent down ``write`` as an 8-byte length and a
    pickle."""
    ok = True
    try:
        with os.fdopen(write, "wb") as pipe:
            while ok and (i := take()) is not None:
                message, ok = _outcome(functools.partial(work, i), i)
                pipe.write(len(message).to_bytes(8, "little"))
                pipe.write(message)
                pipe.flush()
    finally:
        os._exit(0 if ok else 1)
