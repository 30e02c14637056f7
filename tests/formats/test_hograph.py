

def test_recompute_false_round_trips_and_default_is_not_written():
    from planner.formats.hograph import graph_from_dict, graph_to_dict
    from planner.graph import Graph, Op, Tensor

    g = Graph.build("g", [Tensor("x", 4), Tensor("y", 4), Tensor("z", 4)],
                    [Op("a", "Rand", ("x",), ("y",), recompute=False), Op("b", "F", ("y",), ("z",))])
    doc = graph_to_dict(g)
    assert doc["nodes"][0]["recompute"] is False and "recompute" not in doc["nodes"][1]
    back = graph_from_dict(doc, "g.json")
    assert [op.recomputable for op in back.ops] == [False, True]


def test_recompute_true_lets_a_source_node_be_recomputed_and_round_trips():
    from planner.formats.hograph import graph_from_dict, graph_to_dict
    from planner.graph import Graph, Op, Tensor

    # A node with no inputs: recomputable only when the graph says so (a source re-reading data it does not hold).
    g = Graph.build("g", [Tensor("y", 4), Tensor("z", 4), Tensor("w", 4)],
                    [Op("load", "Load", (), ("y",)), Op("conv", "Conv", (), ("z",), recompute=True),
                     Op("b", "F", ("y", "z"), ("w",))])
    assert [op.recomputable for op in g.ops] == [False, True, True]
    doc = graph_to_dict(g)
    assert "recompute" not in doc["nodes"][0] and doc["nodes"][1]["recompute"] is True
    back = graph_from_dict(doc, "g.json")
    assert [op.recomputable for op in back.ops] == [False, True, True]
