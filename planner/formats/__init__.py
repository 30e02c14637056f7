"""Graph file formats. ``load_graph`` picks the reader from the file's extension and content."""

from __future__ import annotations

import json
from pathlib import Path

from planner.errors import InputError
from planner.graph import Graph


def read_json(path: str | Path) -> object:
    """Return the parsed JSON of ``path``; raise InputError for a missing file or invalid JSON."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(path), "file", "no such file") from None
    except IsADirectoryError:
        raise InputError(str(path), "file", "is a directory") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "file", "not UTF-8 text (a binary file?)") from None
    except OSError as exc:
        raise InputError(str(path), "file", exc.strerror or str(exc)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(str(path), f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from None


ONNX_OPTIONS = frozenset({"dims", "symbolic", "fold_views"})
CHECKMATE_OPTIONS = frozenset({"time_unit_s", "size_unit_bytes", "macs"})


def _only(options: dict, names: frozenset) -> dict:
    return {k: v for k, v in options.items() if k in names}


def load_graph(path: str | Path, **options) -> Graph:
    """Return the Graph in ``path``: ``ho-graph/1`` JSON, an ``.onnx`` model, the JSON form of an ONNX
    ModelProto, or a Checkmate/Moccasin networkx node-link graph.

    ``options`` go to the importer that reads the file and are ignored by the others: ONNX takes ``dims``
    (symbolic dim values), ``symbolic`` and ``fold_views``; Checkmate/Moccasin graphs take ``time_unit_s``,
    ``size_unit_bytes`` and ``macs``. An option no importer knows is a TypeError.
    """
    unknown = set(options) - ONNX_OPTIONS - CHECKMATE_OPTIONS
    if unknown:
        raise TypeError(f"load_graph() got unknown options: {', '.join(sorted(unknown))}")
    source = str(path)
    if str(path).endswith(".onnx"):
        from planner.formats.onnx_import import load_onnx

        return load_onnx(path, **_only(options, ONNX_OPTIONS))
    doc = read_json(path)
    if isinstance(doc, dict) and doc.get("format") == "ho-graph/1":
        from planner.formats.hograph import graph_from_dict

        return graph_from_dict(doc, source)
    if isinstance(doc, dict) and "links" in doc and "nodes" in doc:
        from planner.formats.checkmate import graph_from_node_link

        return graph_from_node_link(doc, source, **_only(options, CHECKMATE_OPTIONS))
    if isinstance(doc, dict) and "graph" in doc and ("irVersion" in doc or "opsetImport" in doc):
        from planner.formats.onnx_import import load_onnx_json

        return load_onnx_json(doc, source, **_only(options, ONNX_OPTIONS))
    if isinstance(doc, dict) and "format" in doc:
        raise InputError(source, "format", f"unknown format {doc['format']!r} (expected 'ho-graph/1')")
    raise InputError(
        source, "document",
        "not a known graph format (ho-graph/1 JSON with \"format\": \"ho-graph/1\", .onnx, ONNX JSON, "
        "or networkx node-link JSON)",
    )


def save_graph(graph: Graph, path: str | Path) -> None:
    """Write ``graph`` as ``ho-graph/1`` JSON, atomically."""
    from planner.fileio import write_atomic
    from planner.formats.hograph import graph_to_dict

    write_atomic(path, json.dumps(graph_to_dict(graph), indent=1) + "\n")
