"""The compiled placement loop (planner/offsets_kernel.py) against the Python one it replaces on large timelines:
the same offsets, block for block, and valid ones."""

from __future__ import annotations

import random

import pytest

from planner import offsets
from planner.allocator import check_offsets
from planner.offsets import ORDERS, Allocations, assign_offsets, offsets_by_name, place_allocations
from planner.offsets_kernel import place
from planner.timeline import Residency


def _timeline(seed: int, count: int) -> Allocations:
    """Random allocations with what the large timelines have: runs of blocks of one size and time range (KV-cache
    blocks), sizes repeated across blocks, allocations never live (end == start), touching ranges."""
    rng = random.Random(seed)
    names, instance, size, start, end = [], [], [], [], []
    while len(names) < count:
        s = rng.randint(0, 60)
        e = s if rng.random() < 0.05 else rng.randint(s + 1, 64)
        b = rng.choice((64, 128, 128, 256, 96, rng.randint(1, 500)))
        for _ in range(rng.choice((1, 1, 1, 2, 7))):  # a run of identical blocks
            names.append(f"t{len(names)}")
            instance.append(0)
            size.append(b)
            start.append(s)
            end.append(e)
    return Allocations(names, instance, size, start, end)


def _sequence(allocs: Allocations, order: str) -> list[int]:
    key = ORDERS[order]
    names, inst, size, start, end = allocs
    return sorted(range(len(names)), key=lambda i: key(size[i], start[i], end[i]) + (names[i], inst[i]))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fit", ["first", "best"])
def test_the_compiled_loop_places_every_block_where_the_python_loop_does(monkeypatch, seed, fit):
    allocs = _timeline(seed, 300 + 150 * seed)
    for order in ("size", "area", "start"):
        monkeypatch.setattr(offsets, "COMPILED_MIN", 10**9)
        expected = place_allocations(allocs, order, fit)
        got = place(allocs.size, allocs.start, allocs.end, _sequence(allocs, order), lowest=fit == "first")
        assert got == expected, (order, fit)


def test_large_timelines_go_through_the_compiled_loop_and_get_valid_offsets(monkeypatch):
    allocs = _timeline(11, 600)
    residencies = [Residency("hbm", n, "activation", b, s, e) for n, _k, b, s, e in zip(*allocs)]
    monkeypatch.setattr(offsets, "COMPILED_MIN", 10**9)
    python = assign_offsets(residencies, order="size", fit="first")
    calls = []
    monkeypatch.setattr(offsets, "COMPILED_MIN", 100)
    monkeypatch.setattr(offsets.offsets_kernel, "place", lambda *a, **k: calls.append(1) or place(*a, **k))
    compiled = assign_offsets(residencies, order="size", fit="first")
    assert calls and compiled == python
    assert check_offsets(residencies, compiled, 10**12)[0] == []


def test_blocks_never_live_get_offset_zero_and_an_empty_timeline_gets_none():
    assert place([], [], [], [], lowest=True) == []
    assert place([8, 8], [3, 5], [3, 5], [0, 1], lowest=True) == [0, 0]
    # A run of three 4-byte blocks and one of 10 over the same time: side by side, the big one first.
    got = place([4, 4, 4, 10], [0, 0, 0, 0], [5, 5, 5, 5], [3, 0, 1, 2], lowest=False)
    assert got == [10, 14, 18, 0]
    assert offsets_by_name(Allocations(["a"], [0], [4], [0], [1]), place([4], [0], [1], [0], True)) == {"a": 0}
