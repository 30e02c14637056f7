"""Static offsets by the lowest-floor descent and its depth-first search (planner/offsets_search.py)."""

from __future__ import annotations

import random

from test_offsets_cpsat import TIGHT  # peak 8 bytes; best fit reaches 9

from planner import offsets_search
from planner.allocator import check_offsets
from planner.offsets import TRIES, allocations, allocations_height, offsets_by_name, place_allocations
from planner.offsets_cpsat import fit_offsets, offsets_within
from planner.offsets_search import PREORDERS, descend, search_offsets
from planner.timeline import Residency


def _res(name: str, nbytes: int, start: int, end: int) -> Residency:
    return Residency("hbm", name, "activation", nbytes, start, end)


def _peak(residencies) -> int:
    times = sorted({r.start_ns for r in residencies})
    return max(sum(r.bytes for r in residencies if r.start_ns <= t < r.end_ns) for t in times)


def _random_timeline(rng: random.Random, blocks: tuple[int, int], horizon: int) -> list[Residency]:
    res = []
    for i in range(rng.randint(*blocks)):
        s = rng.randint(0, horizon - 1)
        res.append(_res(f"t{i}", rng.randint(1, 6), s, rng.randint(s + 1, horizon)))
    return res


# Best fit's lowest height over its (order, fit) pairs is 11; the descent reaches 10, the peak. Found by a search
# over random timelines (the 329th of seed 0).
DESCENT_BEATS_BEST_FIT = [
    _res("t0", 1, 3, 9), _res("t1", 3, 4, 9), _res("t2", 1, 0, 8),
    _res("t3", 6, 8, 9), _res("t4", 4, 0, 8), _res("t5", 2, 1, 3),
]


def test_the_descent_reaches_the_peak_where_best_fit_does_not():
    res = DESCENT_BEATS_BEST_FIT
    allocs = allocations(res)
    assert _peak(res) == 10
    assert min(allocations_height(allocs, place_allocations(allocs, o, f)) for o, f in TRIES) == 11
    offs = descend(allocs)
    assert offs is not None
    assert check_offsets(res, offsets_by_name(allocs, offs), 10) == ([], 10)


def test_offsets_within_takes_the_descent_when_best_fit_overflows():
    offs, height = offsets_within(DESCENT_BEATS_BEST_FIT, 10, effort=0)  # no exact model: the descent alone
    assert height == 10 and check_offsets(DESCENT_BEATS_BEST_FIT, offs, 10)[0] == []


def test_the_search_fits_exactly_where_the_exact_model_does():
    """The search is complete: with tries enough it finds offsets within a capacity whenever CP-SAT's exact model
    does (on timelines this small CP-SAT answers for sure), and they are valid. Checked at the peak on random
    timelines where best fit overflows it (on most others best fit answers first)."""
    rng = random.Random(3)
    hard = 0
    while hard < 15:
        res = _random_timeline(rng, (5, 9), horizon=8)
        cap = _peak(res)
        allocs = allocations(res)
        if min(allocations_height(allocs, place_allocations(allocs, o, f)) for o, f in TRIES) <= cap:
            continue
        hard += 1
        found, fits = search_offsets(allocs, cap, try_limit=100_000)
        exact = fit_offsets(res, cap)
        assert fits == (exact is not None)
        violations, height = check_offsets(res, offsets_by_name(allocs, found), cap)
        assert all(v.kind == "capacity" for v in violations) and (height <= cap) == fits
        assert search_offsets(allocs, cap, try_limit=100_000) == (found, fits)  # the same every run


def test_below_the_peak_and_at_it():
    """Below the peak the lowest descent is returned, not fitting; at the peak the search fits where no descent
    does."""
    allocs = allocations(TIGHT)
    below, fits = search_offsets(allocs, 7)
    assert not fits and allocations_height(allocs, below) == min(
        allocations_height(allocs, descend(allocs, p)) for p in PREORDERS)
    assert min(allocations_height(allocs, descend(allocs, p)) for p in PREORDERS) > 8
    found, fits = search_offsets(allocs, 8)
    assert fits and check_offsets(TIGHT, offsets_by_name(allocs, found), 8) == ([], 8)


def test_the_try_limit_stops_the_search():
    """With no tries beyond the first descent the search answers only when that descent fits."""
    allocs = allocations(TIGHT)
    assert allocations_height(allocs, descend(allocs)) > 8
    assert search_offsets(allocs, 8, try_limit=0, preorders=("WAT",))[1] is False
    assert search_offsets(allocs, 8, try_limit=100_000, preorders=("WAT",))[1] is True


def test_empty_and_instant_allocations_get_offset_zero():
    res = [_res("a", 4, 0, 2), _res("empty", 0, 0, 3), _res("instant", 5, 1, 1), _res("b", 4, 1, 3)]
    allocs = allocations(res)
    for offs in (descend(allocs), search_offsets(allocs, 8)[0]):
        assert offs is not None
        by_name = offsets_by_name(allocs, offs)
        assert by_name["empty"] == 0 and by_name["instant"] == 0
        # (check_offsets takes every live block to have bytes: two live blocks never share an offset there)
        assert check_offsets([r for r in res if r.bytes], by_name, 8)[0] == []


def test_large_timelines_are_left_to_best_fit(monkeypatch):
    monkeypatch.setattr(offsets_search, "SEARCH_MAX_BLOCKS", 5)
    allocs = allocations(TIGHT)
    assert descend(allocs) is None and search_offsets(allocs, 8) is None


def test_the_compiled_search_gives_the_python_search_s_offsets(monkeypatch):
    """offsets_search_kernel.search against _Search.run: the same answer and the same offsets, block for block,
    on descents and on searches that backtrack and hit their try limit."""
    rng = random.Random(5)
    cases = []
    while len(cases) < 12:
        res = _random_timeline(rng, (6, 14), horizon=8)
        allocs = allocations(res)
        if not search_offsets(allocs, _peak(res), try_limit=0)[1]:  # no descent fits: the search backtracks
            cases.append((allocs, _peak(res)))
    answers = {}
    for compiled_min in (10**9, 0):  # Python first, then the kernel for every timeline
        monkeypatch.setattr(offsets_search, "COMPILED_MIN", compiled_min)
        answers[compiled_min] = [
            (search_offsets(allocs, cap, try_limit=limit), descend(allocs, "TAW"))
            for allocs, cap in cases for limit in (0, 3, 100_000)]
    assert answers[0] == answers[10**9]
    assert {fits for (_, fits), _ in answers[0]} == {True, False}
