"""autoplan.forking: work run in a forked process comes back as it would in the caller."""

from __future__ import annotations

import os
import time

import pytest

from autoplan import forking


def _fork_here(monkeypatch: pytest.MonkeyPatch, fork: bool) -> None:
    if fork and "fork" not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip("this platform does not fork")
    monkeypatch.setattr(forking, "can_fork", lambda: fork)


@pytest.mark.parametrize("fork", [True, False])
def test_the_result_comes_back_and_the_closure_needs_no_pickling(
        monkeypatch: pytest.MonkeyPatch, fork: bool) -> None:
    _fork_here(monkeypatch, fork)
    built = {"groups": list(range(1000))}  # reached through the closure: inherited, not sent
    pending = forking.beside(lambda: (os.getpid(), sum(built["groups"])))
    pid, total = pending.result()
    assert total == 499_500
    assert (pid != os.getpid()) is fork


@pytest.mark.parametrize("fork", [True, False])
def test_an_exception_in_the_work_is_raised_to_the_caller(
        monkeypatch: pytest.MonkeyPatch, fork: bool) -> None:
    _fork_here(monkeypatch, fork)

    def fails() -> None:
        raise ValueError("no layer split fits")

    pending = forking.beside(fails)
    with pytest.raises(ValueError, match="no layer split fits"):
        pending.result()


def test_a_result_that_does_not_pickle_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    _fork_here(monkeypatch, True)
    pending = forking.beside(lambda: (lambda: None))  # a lambda does not pickle
    with pytest.raises(Exception, match="pickle|Can't"):
        pending.result()


@pytest.mark.parametrize("fork", [True, False])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_deal_runs_every_task_once_and_tells_each(monkeypatch: pytest.MonkeyPatch, fork: bool,
                                                  workers: int) -> None:
    _fork_here(monkeypatch, fork)
    told: list[int] = []
    def work(i: int) -> tuple[int, int]:
        time.sleep(0.02)  # long enough that every process gets a task
        return i * i, os.getpid()

    found = forking.deal(range(7), work, lambda i, _: told.append(i), workers)
    assert {i: v for i, (v, _) in found.items()} == {i: i * i for i in range(7)}
    assert sorted(told) == list(range(7))
    pids = {pid for _, pid in found.values()}
    if fork and workers > 1:
        assert len(pids) <= workers
    else:  # here, in order
        assert told == list(range(7)) and pids == {os.getpid()}


def test_deal_takes_from_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process works up from the front, the second from the back: each runs
    neighbouring tasks."""
    _fork_here(monkeypatch, True)
    def work(i: int) -> int:
        time.sleep(0.02)
        return os.getpid()

    found = forking.deal(range(12), work, workers=2)
    mine = sorted(i for i, pid in found.items() if pid == os.getpid())
    assert mine == list(range(len(mine)))  # a prefix (which processes got how many is a race)
    theirs = sorted(i for i, pid in found.items() if pid != os.getpid())
    assert theirs == list(range(len(mine), 12))  # the rest, a suffix


@pytest.mark.parametrize("fork", [True, False])
def test_deal_takes_the_last_tasks_once_every_other_is_taken(monkeypatch: pytest.MonkeyPatch,
                                                              fork: bool) -> None:
    """``last`` (a sweep's counts too small to hold the model: its quickest) is taken only
    once both ends of ``order`` have met, by whichever process is free first; in turn,
    after ``order``. Each process runs its tasks one after another: every task of
    ``order`` it runs comes before every task of ``last``, and those in their order."""
    _fork_here(monkeypatch, fork)
    r, w = os.pipe()  # each task as it starts, and the process running it

    def work(i: int) -> int:
        os.write(w, f"{os.getpid()} {i}\n".encode())
        time.sleep(0.02)
        return i

    found = forking.deal(range(6), work, workers=2, last=(6, 7, 8))
    os.close(w)
    runs: dict[str, list[int]] = {}
    with os.fdopen(r) as pipe:
        for line in pipe:
            pid, i = line.split()
            runs.setdefault(pid, []).append(int(i))
    assert found == {i: i for i in range(9)}
    for tasks in runs.values():
        tail = [i for i in tasks if i >= 6]
        assert tasks[len(tasks) - len(tail):] == tail == sorted(tail)
    if not fork:
        assert list(runs.values()) == [list(range(9))]


@pytest.mark.parametrize("failing", [0, 6])  # a task of this process's end, and of the child's
def test_deal_raises_what_a_task_raised(monkeypatch: pytest.MonkeyPatch, failing: int) -> None:
    _fork_here(monkeypatch, True)

    def work(i: int) -> int:
        if i == failing:
            raise ValueError(f"task {i} failed")
        return i

    with pytest.raises(ValueError, match=f"task {failing} failed"):
        forking.deal(range(7), work, workers=2)


def test_tasks_waiting_on_a_failed_process_are_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task that waits for another's result (a sweep's ceiling waits for its seed) is
    let go by ``ended`` where the process running that one fails: an error, not a hang."""
    _fork_here(monkeypatch, True)
    seeded = __import__("multiprocessing").get_context("fork").Event()

    def work(i: int) -> int:
        if i == 3:  # the second process takes it first, from the back
            raise ValueError("the seed's search failed")
        assert seeded.wait(timeout=60), "never let go"
        return i

    with pytest.raises(ValueError, match="seed's search failed"):
        forking.deal(range(4), work, workers=2, ended=seeded.set)


def test_a_failure_here_stops_the_other_processes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this process's task fails, the children's tasks are not wanted: they are
    stopped, not waited for (each here would take a minute)."""
    _fork_here(monkeypatch, True)

    def work(i: int) -> int:
        if i == 0:
            time.sleep(0.2)  # the child has taken its first task by now
            raise ValueError("this one failed")
        time.sleep(60)
        return i

    started = time.monotonic()
    with pytest.raises(ValueError, match="this one failed"):
        forking.deal(range(4), work, workers=2)
    assert time.monotonic() - started < 30


def test_abandoned_work_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    _fork_here(monkeypatch, True)
    pending = forking.beside(lambda: time.sleep(60))
    started = time.monotonic()
    pending.abandon()
    assert time.monotonic() - started < 30
