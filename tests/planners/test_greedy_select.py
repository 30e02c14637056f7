"""Greedy's selection (planner/planners/greedy_select.py): the link calendar's batched fit check, which the distance
rule uses, says of every gap what its one-gap stall estimate says."""

from __future__ import annotations

import random

import numpy as np
from conftest import simple_hardware
from hypothesis import given
from hypothesis import strategies as st
from test_properties import at_fraction, graphs_and_hardware, property_settings

from planner.graph import AUTO, Graph, Op, Tensor, TensorKind
from planner.planners.greedy_select import OVER_BUDGET, Context, LinkCalendar


@property_settings(60)
@given(graphs_and_hardware(max_ops=10), st.floats(0.3, 1.0), st.integers(0, 10**6))
def test_fit_says_what_stall_says_of_every_gap(gh, fraction, seed):
    g, base = gh
    hw = at_fraction(g, fraction, base)
    if hw is None or not hw.remote_tiers:
        return
    ctx = Context(g, hw)
    rng = random.Random(seed)
    cal = LinkCalendar(ctx, hw.hbm_bytes)
    ks = np.arange(len(ctx.gaps), dtype=np.int64)
    cal.link_columns(ks)  # kept in the Context from here on
    # Links partly booked, and some free tensors placed on a remote tier: what the selection sees mid-way.
    for gap in ctx.gaps:
        if rng.random() < 0.3:
            cal.book(gap, rng.choice([None, OVER_BUDGET]))
        if gap.wrap and rng.random() < 0.5:
            ctx.wrapped[gap.tensor] = rng.choice(ctx.tiers)
    rng.shuffle(order := ks.tolist())
    ks = np.array(order, dtype=np.int64)
    for at in (None, OVER_BUDGET):
        got = cal.fit(ks, at, cal.link_columns(ks)).tolist()
        assert got == [cal.stall(ctx.gaps[k], at) == 0 for k in ks.tolist()]


def test_fit_follows_where_the_selection_places_a_free_tensor():
    # A free weight read before and after a long op: the selection scores its mid gap with a Store while it starts
    # on HBM (as it does the master copy's: ``Context.mastered``), none once the selection places it on the host (its
    # copy there is valid). With the store link booked full, the gap fits only in the second case, though the
    # columns were kept in the Context before the placement.
    us = 1e-6
    tensors = [Tensor("x", 10, TensorKind.INPUT), Tensor("w", 100, TensorKind.WEIGHT, home=AUTO),
               Tensor("a", 10), Tensor("b", 10), Tensor("y", 10, TensorKind.OUTPUT)]
    ops = [Op("op0", "F", ("x", "w"), ("a",), duration_s=us), Op("op1", "F", ("a",), ("b",), duration_s=us),
           Op("op2", "F", ("b", "w"), ("y",), duration_s=us)]
    g = Graph.build("free", tensors, ops)
    ctx = Context(g, simple_hardware(hbm=1000))
    cal = LinkCalendar(ctx, 1000)
    mid = next(gap for gap in ctx.gaps if gap.tensor == "w" and not gap.wrap and 0 <= gap.a < gap.u < ctx.n)
    ks = np.array([mid.index], dtype=np.int64)
    cal.free["d2h"][:] = 0
    seen = []
    for tier in (None, "host"):
        if tier:
            ctx.wrapped["w"] = tier
        seen.append((cal.fit(ks, None, cal.link_columns(ks)).tolist(), cal.stall(mid) == 0))
    assert seen == [([False], False), ([True], True)]
