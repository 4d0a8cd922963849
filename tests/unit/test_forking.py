"""autoplan.forking: work run in a forked process comes back as it would in the caller."""

from __future__ import annotations

import os

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
