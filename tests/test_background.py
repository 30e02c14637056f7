"""planner/background.py: a result computed beside the caller is the one the caller would compute."""

from __future__ import annotations

import os
import time

import pytest

import planner.background as background
from planner.background import Background, can_fork

needs_fork = pytest.mark.skipif(not can_fork(), reason="no fork or one core: nothing runs beside")


def _pid_and_table(n: int) -> tuple[int, dict[int, list[int]]]:
    return os.getpid(), {k: list(range(k)) for k in range(n)}


@needs_fork
def test_the_result_comes_from_a_child_and_equals_the_callers():
    pid, table = Background(_pid_and_table, 300).result()
    assert pid != os.getpid()  # computed in the child
    assert table == _pid_and_table(300)[1]


def test_without_a_second_core_the_caller_computes_the_result(monkeypatch):
    monkeypatch.setattr(background, "can_fork", lambda: False)
    pid, table = Background(_pid_and_table, 5).result()
    assert pid == os.getpid() and table == _pid_and_table(5)[1]


def _fails_in_a_child(parent: int) -> str:
    if os.getpid() != parent:
        raise RuntimeError("the child cannot")
    return "computed by the caller"


@needs_fork
def test_a_child_that_fails_leaves_the_result_to_the_caller():
    assert Background(_fails_in_a_child, os.getpid()).result() == "computed by the caller"


def _exits_in_a_child(parent: int) -> str:
    if os.getpid() != parent:
        os._exit(3)  # dies without a word, as a crash would
    return "computed by the caller"


@needs_fork
def test_a_child_that_dies_leaves_the_result_to_the_caller():
    assert Background(_exits_in_a_child, os.getpid()).result() == "computed by the caller"


def test_an_error_of_the_function_reaches_the_caller():
    with pytest.raises(ZeroDivisionError):
        Background(lambda: 1 // 0).result()


@needs_fork
def test_a_cancelled_child_is_stopped_at_once():
    t = time.monotonic()
    with Background(time.sleep, 30):
        pass  # its result is not wanted
    assert time.monotonic() - t < 10


def test_the_result_is_computed_once():
    calls = []
    job = Background(lambda: calls.append(1) or len(calls))
    assert job.result() == job.result()


@needs_fork
def test_ready_by_waits_until_the_deadline_at_most():
    with Background(time.sleep, 30) as slow:
        t = time.monotonic()
        assert not slow.ready_by(t + 0.2)
        assert time.monotonic() - t < 10
    quick = Background(_pid_and_table, 3)
    assert quick.ready_by(time.monotonic() + 30) and quick.result()[1] == _pid_and_table(3)[1]


def test_without_a_child_the_result_is_always_ready(monkeypatch):
    monkeypatch.setattr(background, "can_fork", lambda: False)
    assert Background(time.sleep, 30).ready_by(time.monotonic())


@needs_fork
def test_a_child_that_cannot_start_leaves_the_result_to_the_caller(monkeypatch):
    """A daemonic process may not have children (multiprocessing refuses): the caller computes the result."""
    import multiprocessing

    def refuse(self):
        raise AssertionError("daemonic processes are not allowed to have children")

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", refuse)
    pid, table = Background(_pid_and_table, 4).result()
    assert pid == os.getpid() and table == _pid_and_table(4)[1]
