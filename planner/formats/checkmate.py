"""Import Checkmate / Moccasin graphs: networkx node-link JSON (``networkx.node_link_data``; edges under
``"links"``), as used by the public rematerialization literature.

Two node schemas:

- Checkmate's ``dfgraph_from_keras`` extraction (the ``*_train_nx.json`` / ``*_test_nx.json`` CNNs):
  ``cost_cpu`` (op cost), ``cost_ram`` (bytes of the op's output), ``backward``, ``name``, ``id``.
- The random layered graphs of "Neural Topological Ordering for Computation Graphs" (Appendix A):
  ``duration``, ``out_cost`` (output size), ``param_cost`` (parameter size), ``name`` (the node key); their links
  name the endpoints ``"0"`` and ``"1"`` instead of ``"source"`` and ``"target"``; ``graph.order`` is a
  topological order.

Each node becomes one op with one output tensor of ``cost_ram``/``out_cost`` bytes (times ``size_unit_bytes``),
kind ``gradient`` for backward nodes, ``output`` for the graph's sinks, ``activation`` otherwise; an edge u -> v
makes u's output an input of v. A node with ``param_cost`` > 0 also reads a weight tensor of that size. A node
with no inputs reads the step's input batch, which the format leaves out (of the graph and of its memory count);
as in Checkmate's and Moccasin's models, a plan may recompute it (``Op.recompute=True``).

Units, which the files do not state:

- Sizes: ``cost_ram`` is bytes. In the Keras CNNs it is exactly 4 bytes (fp32) times the layer's output
  elements at the batch size in the file name (VGG16 at batch 256, ``block1_conv1``: 256 x 224 x 224 x 64 x 4 =
  3288334336). ``out_cost``/``param_cost`` of the random graphs (10 to 8180) have no unit; they are read as bytes
  too unless ``size_unit_bytes`` says otherwise (``1e6`` makes them MB, a more realistic scale).
- Time: ``cost_cpu``/``duration`` are read as multiples of ``time_unit_s``, by default 10 us
  (``DEFAULT_TIME_UNIT_S``): that makes the profiled Keras ops 0.2 to 60 ms, median 2 to 6 ms, and whole
  forward passes plausible for the batch sizes in the names (VGG16 at batch 256: 67 ms, about 118 TFLOP/s;
  read as microseconds, the same file would run at 1.2 PFLOP/s, beyond any GPU of the time). Some files
  (``fcn_8_vgg``) hold multiply-accumulate counts instead of times (``block1_conv1``: 32 x 416 x 608 x 64 x 27 =
  13985906688 MACs): when ``time_unit_s`` is not given and the largest ``cost_cpu`` is at least 1e9 (over 2.7
  hours per op in 10 us units), the costs are read as MACs: ``flops = 2 x cost_cpu`` and the op's duration
  comes from the roofline cost model. ``macs=True``/``False`` forces either reading.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from planner.errors import InputError
from planner.graph import AUTO, Graph, Op, Tensor, TensorKind

DEFAULT_TIME_UNIT_S = 1e-5
MACS_THRESHOLD = 1e9


def graph_from_node_link(doc: Any, source: str, time_unit_s: float | None = None, size_unit_bytes: float = 1,
                         macs: bool | None = None, name: str | None = None) -> Graph:
    """Return the Graph of a Checkmate/Moccasin node-link document (see the module docstring)."""
    if not isinstance(doc, dict):
        raise InputError(source, "document", "top level must be a JSON object")
    nodes, links = doc.get("nodes"), doc.get("links")
    if not isinstance(nodes, list) or not nodes:
        raise InputError(source, "nodes", "must be a non-empty list of node objects")
    if not isinstance(links, list):
        raise InputError(source, "links", "must be a list of link objects")
    if time_unit_s is not None and (not isinstance(time_unit_s, (int, float)) or isinstance(time_unit_s, bool)
                                    or not math.isfinite(time_unit_s) or time_unit_s <= 0):
        raise InputError("command line", "--time-unit", f"{time_unit_s!r} must be a positive time")
    if (not isinstance(size_unit_bytes, (int, float)) or isinstance(size_unit_bytes, bool)
            or not math.isfinite(size_unit_bytes) or size_unit_bytes <= 0):
        raise InputError("command line", "--size-unit", f"{size_unit_bytes!r} must be a positive size")
    meta = doc.get("graph") if isinstance(doc.get("graph"), dict) else {}

    # Node records: key, label, size, cost, backward flag, parameter size.
    key_field = "id" if all(isinstance(n, dict) and "id" in n for n in nodes) else "name"
    recs: dict[Any, dict] = {}
    for i, n in enumerate(nodes):
        item = f"nodes[{i}]"
        if not isinstance(n, dict):
            raise InputError(source, item, "must be an object")
        if key_field not in n:
            raise InputError(source, item, "has neither 'id' nor 'name'")
        key = n[key_field]
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise InputError(source, item, f"node key {key!r} must be a string or an integer")
        if key in recs:
            raise InputError(source, item, f"node {key!r} appears twice")
        if "cost_ram" in n or "cost_cpu" in n:
            size_f, cost_f = "cost_ram", "cost_cpu"
        elif "out_cost" in n or "duration" in n:
            size_f, cost_f = "out_cost", "duration"
        else:
            raise InputError(source, item, "needs cost_cpu and cost_ram, or duration and out_cost")
        vals = {}
        for f in (size_f, cost_f, "param_cost"):
            v = n.get(f, 0 if f == "param_cost" else None)
            if v is None:
                raise InputError(source, item, f"missing field {f!r}")
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise InputError(source, f"{item}.{f}", f"must be a non-negative number, got {v!r}")
            vals[f] = v
        label = n.get("name", key)
        recs[key] = {"label": str(label), "size": vals[size_f], "cost": vals[cost_f], "param": vals["param_cost"],
                     "backward": bool(n.get("backward", False)), "index": i}

    preds: dict[Any, list] = {k: [] for k in recs}
    succs: dict[Any, int] = {k: 0 for k in recs}
    for j, link in enumerate(links):
        if not isinstance(link, dict):
            raise InputError(source, f"links[{j}]", "must be an object")
        if "source" in link and "target" in link:
            u, v = link["source"], link["target"]
        elif "0" in link and "1" in link:
            u, v = link["0"], link["1"]
        else:
            raise InputError(source, f"links[{j}]", "needs 'source' and 'target'")
        for end in (u, v):
            if not isinstance(end, (str, int)) or isinstance(end, bool) or end not in recs:
                raise InputError(source, f"links[{j}]", f"endpoint {end!r} is not a node")
        if u == v:
            raise InputError(source, f"links[{j}]", f"self-loop on node {u!r}")
        if u not in preds[v]:
            preds[v].append(u)
            succs[u] += 1

    # Unique op names: the node's name, or name#key when names repeat.
    labels = [r["label"] for r in recs.values()]
    dup = {x for x, c in Counter(labels).items() if c > 1}
    op_name = {k: (f"{r['label']}#{k}" if r["label"] in dup else r["label"]) for k, r in recs.items()}

    is_checkmate = any("cost_cpu" in n for n in nodes)
    if macs is None:
        macs = bool(time_unit_s is None and is_checkmate and max(r["cost"] for r in recs.values()) >= MACS_THRESHOLD)
    unit = DEFAULT_TIME_UNIT_S if time_unit_s is None else float(time_unit_s)

    tensors: list[Tensor] = []
    out_name: dict[Any, str] = {}
    for k, r in recs.items():
        t = f"{op_name[k]}:out"
        out_name[k] = t
        kind = TensorKind.OUTPUT if succs[k] == 0 else TensorKind.GRADIENT if r["backward"] else TensorKind.ACTIVATION
        tensors.append(Tensor(name=t, bytes=max(1, math.ceil(r["size"] * size_unit_bytes)), kind=kind))
        if r["param"] > 0:
            # The format names no tiers: where parameters start is the planner's choice (planner/placement.py).
            tensors.append(Tensor(name=f"{op_name[k]}:param", bytes=max(1, math.ceil(r["param"] * size_unit_bytes)),
                                  kind=TensorKind.WEIGHT, home=AUTO))
    sizes = {t.name: t.bytes for t in tensors}

    # Op order: the file's topological order when it gives one, else node order (Graph.build sorts stably).
    order = list(recs)
    given = meta.get("order")
    if isinstance(given, list) and sorted(map(str, given)) == sorted(map(str, recs)):
        by_str = {str(k): k for k in recs}
        order = [by_str[str(x)] for x in given]
    ops: list[Op] = []
    for k in order:
        r = recs[k]
        inputs = tuple(out_name[u] for u in preds[k])
        if r["param"] > 0:
            inputs += (f"{op_name[k]}:param",)
        accessed = sum(sizes[t] for t in inputs) + sizes[out_name[k]]
        # A source node reads the step's input batch, which the format neither holds nor counts in memory:
        # Checkmate's and Moccasin's models may recompute it like any node (re-reading that batch).
        cost = {"flops": 2.0 * r["cost"]} if macs else {"duration_s": _seconds(r["cost"] * unit)}
        ops.append(Op(name=op_name[k], op_type="backward" if r["backward"] else "forward", inputs=inputs,
                      outputs=(out_name[k],), bytes_accessed=float(accessed), recompute=True if not inputs else None,
                      **cost))
    file_name = meta.get("name") if isinstance(meta.get("name"), str) else None
    gname = name or file_name or "checkmate"
    metadata = {
        "source_format": "checkmate" if is_checkmate else "moccasin-random-layered",
        "cost": "macs" if macs else f"time x {unit:g} s",
        "size_unit_bytes": size_unit_bytes,
    }
    return Graph.build(gname, tensors, ops, source=source, metadata=metadata)


def _seconds(s: float) -> float:
    """``s`` snapped to whole nanoseconds when it is one up to float noise (360 x 1e-5 s is 3600000.0000000005
    ns, which the cost model's ceiling would make 3600001 ns)."""
    ns = s * 1e9
    r = round(ns)
    if abs(ns - r) > 1e-6 * max(1, r):
        return s
    out = r / 1e9
    for _ in range(4):
        if math.ceil(out * 1e9) <= r:
            break
        out = math.nextafter(out, 0.0)
    return out
