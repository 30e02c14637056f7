"""ho-schedule/1 files: deterministic bytes, re-validation, tampering and wrong-graph detection."""

import json

import pytest
from conftest import GRAPHS

from planner import api
from planner.errors import InputError
from planner.formats import load_graph
from planner.formats.hograph import graph_sha256
from planner.schedule import dumps_schedule, schedule_to_dict, validate_schedule, write_schedule


@pytest.fixture(scope="module")
def planned():
    g = load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="1.2GB")
    r = api.plan(g, hw, planner="reactive")
    assert r.timeline.valid
    return g, hw, r


def test_same_input_same_bytes(planned, tmp_path):
    g, hw, r = planned
    again = api.plan(load_graph(GRAPHS / "transformer_block.json"), hw, planner="reactive")
    write_schedule(tmp_path / "a.json", g, hw, r.plan, r.timeline)
    write_schedule(tmp_path / "b.json", g, hw, again.plan, again.timeline)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_fields(planned):
    g, hw, r = planned
    doc = schedule_to_dict(g, hw, r.plan, r.timeline)
    assert doc["format"] == "ho-schedule/1"
    assert doc["graph"]["sha256"] == graph_sha256(g) and len(doc["graph"]["sha256"]) == 64
    assert doc["hardware"]["tiers"][0] == {"name": "hbm", "capacity_bytes": 1_200_000_000}
    assert {e["kind"] for e in doc["program"]} >= {"compute", "prefetch", "store", "detach"}
    assert len(doc["timeline"]) == len(doc["program"])
    assert doc["metrics"]["peak_bytes"]["hbm"] <= 1_200_000_000
    assert doc["metrics"]["bytes_moved"]["d2h"] > 0
    assert json.loads(dumps_schedule(doc)) == doc


def test_validate_round_trip(planned):
    g, hw, r = planned
    doc = json.loads(dumps_schedule(schedule_to_dict(g, hw, r.plan, r.timeline)))
    report = validate_schedule(doc, g, "s.json")
    assert report.ok


def test_tampered_timeline_is_a_mismatch(planned):
    g, hw, r = planned
    doc = json.loads(dumps_schedule(schedule_to_dict(g, hw, r.plan, r.timeline)))
    doc["timeline"][3]["end_us"] -= 1
    doc["metrics"]["makespan_us"] -= 1
    report = validate_schedule(doc, g, "s.json")
    assert not report.ok and len(report.mismatches) == 2


def test_tampered_program_is_a_violation(planned):
    g, hw, r = planned
    doc = json.loads(dumps_schedule(schedule_to_dict(g, hw, r.plan, r.timeline)))
    first_prefetch = next(e for e in doc["program"] if e["kind"] == "prefetch" and e["waits"])
    doc["program"] = [e if e is not first_prefetch else {**e, "kind": "detach"} for e in doc["program"]]
    assert not validate_schedule(doc, g, "s.json").timeline.valid


def test_other_graph_is_an_error(planned):
    g, hw, r = planned
    doc = schedule_to_dict(g, hw, r.plan, r.timeline)
    other = load_graph(GRAPHS / "remote_weights_chain.json")
    with pytest.raises(InputError, match="made for graph 'transformer_block'"):
        validate_schedule(doc, other, "s.json")


def test_malformed_schedule_is_an_input_error(planned):
    g, hw, r = planned
    doc = schedule_to_dict(g, hw, r.plan, r.timeline)
    doc["program"][0] = {"id": 0, "kind": "teleport"}
    with pytest.raises(InputError, match="malformed schedule"):
        validate_schedule(doc, g, "s.json")
