"""Run a deterministic function in a forked child while the caller goes on, and take its result when needed.

Greedy's plans on 30k-op graphs are single-threaded and cost tens of seconds; a machine has a second core. A
``Background`` computes a result the caller may need later (greedy's plan for a lower budget, for when the static
offsets of the plan at the full budget do not fit) in a child forked from the caller, so that the child inherits
every input without pickling it, and sends the result back through a pipe.

The result never depends on whether the child ran: where fork is not available, with one core, or when the child
fails (it crashed, or its result does not pickle), ``result()`` computes the function in the caller. So a plan is
the same with and without a second core; only the wall time differs. ``cancel()`` kills a child whose result is no
longer needed. The child ignores SIGINT (a terminal sends it to the whole process group), so Ctrl-C reaches the
caller only, which cancels the child on the way out (use it as a context manager).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a ``Background`` can run beside the caller: on Linux (macOS has fork, but frameworks there are not
    safe to use in a forked child), with a second core."""
    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods() and cores() >= 2


class Background(Generic[T]):
    """``fn(*args)``, computed in a forked child when ``can_fork()`` (else in ``result()``)."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._proc = None
        self._conn = None
        self._done = False
        self._result: T | None = None
        if can_fork():
            ctx = mp.get_context("fork")
            self._conn, child = ctx.Pipe(duplex=False)
            try:
                proc = ctx.Process(target=_child, args=(fn, args, child), daemon=True)
                proc.start()
            except (AssertionError, OSError):  # a daemonic process may not have children; out of processes
                self._conn.close()
            else:
                self._proc = proc
            child.close()

    def ready_by(self, deadline: float) -> bool:
        """Whether the result is in by ``deadline`` (``time.monotonic()``), waiting until then at most; always
        True with no child (``result()`` computes it here)."""
        if self._done or self._proc is None:
            return True
        try:
            return self._conn.poll(max(0.0, deadline - time.monotonic()))
        except (EOFError, OSError):
            return True  # the child is gone: ``result()`` computes it here

    def result(self) -> T:
        """Wait for the child's result; compute it here when there is no child or it sent none."""
        if self._done:
            return self._result
        self._result = self._compute()
        self._done = True
        return self._result

    def _compute(self) -> T:
        if self._proc is not None:
            got = None
            try:
                got = self._conn.recv()
            except (EOFError, OSError):
                pass
            finally:
                self.cancel()
            if got is not None and got[0] == "ok":
                return pickle.loads(got[1])
        return self._fn(*self._args)

    def cancel(self) -> None:
        """Stop the child (its result is no longer wanted)."""
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join()
            self._conn.close()
            self._proc = None

    def __enter__(self) -> Background[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


@contextmanager
def forked_child(conn) -> Iterator[None]:
    """The body of a forked child that answers through the pipe end ``conn``: any failure is sent as ``("error",
    repr)``, and the child then exits at once, without the cleanup (atexit, finalizers) of the process it copies."""
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        try:
            conn.send(("error", repr(exc)))
        except Exception:
            pass
    finally:
        conn.close()
        os._exit(0)


def _child(fn: Callable, args: tuple, conn) -> None:
    with forked_child(conn):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        conn.send(("ok", pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL)))


__all__ = ["Background", "can_fork", "cores", "forked_child"]
