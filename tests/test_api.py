"""``planner.api``: the Python entry points users call directly check their input as the CLI does."""

from __future__ import annotations

import pytest
from conftest import GRAPHS

from planner import api
from planner.errors import InputError


def test_the_no_offload_reference_names_a_tier_the_hardware_lacks():
    # remote_weights_chain keeps its weights on the pool, which only cloudmatrix384 has: the reference used to end
    # in StopIteration looking for a link to it.
    g = api.load_graph(GRAPHS / "remote_weights_chain.json")
    with pytest.raises(InputError, match=r"tensor 'w0'.*home tier 'pool' is not on hardware 'ascend-910c'"):
        api.no_offload_reference(g, api.hardware())
    ref = api.no_offload_reference(g, api.hardware("cloudmatrix384"))
    assert ref.valid and ref.metrics.makespan_ns > 0
