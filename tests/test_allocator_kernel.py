"""The compiled caching-allocator replay (planner/allocator_kernel.py) against the Python ``CachingAllocator``:
the same report (failures, every defragmentation event, high water, overflows) on random logs."""

from __future__ import annotations

import random

import pytest

from planner import allocator
from planner.allocator import ALLOC, FREE, replay_caching


def _log(seed: int, count: int) -> list[tuple[int, int, str, int, int | None]]:
    """Random allocations and frees over a small arena: fragmentation, compactions, overflows, frees of names never
    allocated, names allocated again after their free. (No zero-size block: the executor allocates none.)"""
    rng = random.Random(seed)
    live: list[str] = []
    log = []
    t = 0
    for k in range(count):
        t += rng.randint(0, 3)
        if live and rng.random() < 0.45:
            name = live.pop(rng.randrange(len(live)))
            log.append((t, FREE, name, 0, None))
        elif rng.random() < 0.02:
            log.append((t, FREE, f"ghost{k}", 0, None))
        else:
            name = f"b{rng.randint(0, count // 3)}"
            if name in live:
                continue
            size = rng.choice((16, 32, 48, 100, rng.randint(1, 400)))
            live.append(name)
            log.append((t, ALLOC, name, size, k if rng.random() < 0.9 else None))
    return log


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("capacity", [1500, 3000, 6000])
def test_the_compiled_replay_reports_what_the_python_replay_reports(monkeypatch, seed, capacity):
    log = _log(seed, 1200)
    python = replay_caching(log, capacity, 1e9, compiled=False)
    monkeypatch.setattr(allocator, "COMPILED_MIN", 0)
    monkeypatch.setattr(allocator, "COMPILED_MAX_DEFRAGS", 10**6)
    compiled = replay_caching(log, capacity, 1e9)
    assert compiled == python
    assert python.defrags or python.overflows or capacity == 6000  # the tight arenas do compact or overflow


def test_past_its_compaction_limit_the_compiled_replay_hands_over_to_python(monkeypatch):
    log = _log(3, 1500)
    python = replay_caching(log, 1500, 1e9, alignment=8, compiled=False)
    assert len(python.defrags) > 2
    calls = []
    monkeypatch.setattr(allocator, "COMPILED_MIN", 0)
    monkeypatch.setattr(allocator, "COMPILED_MAX_DEFRAGS", 2)
    kernel = allocator.allocator_kernel.replay
    monkeypatch.setattr(allocator.allocator_kernel, "replay", lambda *a: calls.append(1) or kernel(*a))
    assert replay_caching(log, 1500, 1e9, alignment=8) == python
    assert calls
