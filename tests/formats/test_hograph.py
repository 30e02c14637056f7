

def test_recompute_false_round_trips_and_default_is_not_written():
    from planner.formats.hograph import graph_from_dict, graph_to_dict
    from planner.graph import Graph, Op, Tensor

    g = Graph.build("g", [Tensor("x", 4), Tensor("y", 4), Tensor("z", 4)],
                    [Op("a", "Rand", ("x",), ("y",), recompute=False), Op("b", "F", ("y",), ("z",))])
    doc = graph_to_dict(g)
    assert doc["nodes"][0]["recompute"] is False and "recompute" not in doc["nodes"][1]
    back = graph_from_dict(doc, "g.json")
    assert [op.recomputable for op in back.ops] == [False, True]
