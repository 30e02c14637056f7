"""Graph file formats: one module per format, one row per format in ``FORMATS``, which ``load_graph`` reads.

Adding a format: a module with a reader that returns a validated ``Graph`` (``Graph.build``), and a ``Format`` row
below saying how a file is recognised and which ``load_graph`` options its reader takes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner.errors import InputError
from planner.fileio import read_json, write_atomic
from planner.formats.checkmate import graph_from_node_link
from planner.formats.hograph import FORMAT as HOGRAPH
from planner.formats.hograph import graph_from_dict, graph_to_dict
from planner.formats.onnx_import import load_onnx, load_onnx_json
from planner.graph import Graph


@dataclass(frozen=True)
class Format:
    """A graph format ``load_graph`` reads.

    ``matches(path, doc)`` says whether a file is in this format: ``doc`` is the parsed JSON for formats read as
    JSON (``json=True``), else None. ``read(path, doc, source, **options)`` returns the Graph; it receives only the
    ``options`` named here."""

    name: str
    matches: Callable[[str, object], bool]
    read: Callable[..., Graph]
    options: frozenset[str] = frozenset()
    json: bool = True


ONNX_OPTIONS = frozenset({"dims", "symbolic", "fold_views"})
CHECKMATE_OPTIONS = frozenset({"time_unit_s", "size_unit_bytes", "macs"})

FORMATS: tuple[Format, ...] = (
    Format("onnx", lambda path, _doc: path.endswith(".onnx"),
           lambda path, _doc, _source, **o: load_onnx(path, **o), ONNX_OPTIONS, json=False),
    Format(HOGRAPH, lambda _path, doc: isinstance(doc, dict) and doc.get("format") == HOGRAPH,
           lambda _path, doc, source: graph_from_dict(doc, source)),
    Format("networkx node-link (Checkmate, Moccasin)",
           lambda _path, doc: isinstance(doc, dict) and "links" in doc and "nodes" in doc,
           lambda _path, doc, source, **o: graph_from_node_link(doc, source, **o), CHECKMATE_OPTIONS),
    Format("ONNX JSON",
           lambda _path, doc: isinstance(doc, dict) and "graph" in doc and ("irVersion" in doc or "opsetImport" in doc),
           lambda _path, doc, source, **o: load_onnx_json(doc, source, **o), ONNX_OPTIONS),
)


def load_graph(path: str | Path, **options) -> Graph:
    """Return the Graph in ``path``: ``ho-graph/1`` JSON, an ``.onnx`` model, the JSON form of an ONNX
    ModelProto, or a Checkmate/Moccasin networkx node-link graph (``FORMATS``).

    ``options`` go to the reader of the file's format and are ignored by the others: ONNX takes ``dims``
    (symbolic dim values), ``symbolic`` and ``fold_views``; Checkmate/Moccasin graphs take ``time_unit_s``,
    ``size_unit_bytes`` and ``macs``. An option no reader knows is a TypeError.
    """
    unknown = set(options) - frozenset().union(*(f.options for f in FORMATS))
    if unknown:
        raise TypeError(f"load_graph() got unknown options: {', '.join(sorted(unknown))}")
    source = str(path)
    doc = None
    for fmt in sorted(FORMATS, key=lambda f: f.json):  # by name first: a .onnx file is not JSON
        if fmt.json and doc is None:
            doc = read_json(path)
        if fmt.matches(source, doc):
            return fmt.read(path, doc, source, **{k: v for k, v in options.items() if k in fmt.options})
    if isinstance(doc, dict) and "format" in doc:
        raise InputError(source, "format", f"unknown format {doc['format']!r} (expected {HOGRAPH!r})")
    raise InputError(
        source, "document",
        f"not a known graph format ({HOGRAPH} JSON with \"format\": \"{HOGRAPH}\", .onnx, ONNX JSON, "
        "or networkx node-link JSON)",
    )


def save_graph(graph: Graph, path: str | Path) -> None:
    """Write ``graph`` as ``ho-graph/1`` JSON, atomically."""
    write_atomic(path, json.dumps(graph_to_dict(graph), indent=1) + "\n")


__all__ = ["CHECKMATE_OPTIONS", "FORMATS", "Format", "ONNX_OPTIONS", "load_graph", "save_graph"]
