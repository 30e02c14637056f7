"""A checkpoint: the rows of finished points, one JSON line each, appended as they arrive.

An interrupted run loses nothing it had computed: ``--resume`` reads the file back and runs only the points that
are not in it. Each line is ``{"key": KEY, "row": ROW}``, ``KEY`` a digest of the point's function, graph and
parameters (``base.point_key``), so a changed grid reuses exactly the points it shares with the old one. A line is
written whole with one ``write`` and flushed to disk before the next point is reported; a line cut short by a
crash does not parse and is ignored. Values JSON cannot hold (a point's plan, carried for seeding) are stored as
base64 pickles: the file is this program's own cache, read back by the same program.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
from pathlib import Path

from planner.fileio import write_atomic

_PICKLED = "__pickle__"


def _encode(obj: object) -> dict:
    return {_PICKLED: base64.b64encode(pickle.dumps(obj)).decode("ascii")}


def _decode(d: dict) -> object:
    if len(d) == 1 and _PICKLED in d:
        return pickle.loads(base64.b64decode(d[_PICKLED]))
    return d


class Checkpoint:
    """The rows of ``path`` (when ``resume``) and the rows added since. Without ``resume`` the file starts empty."""

    def __init__(self, path: str | Path, resume: bool = False) -> None:
        self.path = Path(path)
        self._lines: dict[str, str] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    key = json.loads(line)["key"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # the last line of a run killed mid-write
                self._lines[key] = line
            # Rewrite without the cut lines, so that appends start on a line of their own.
            write_atomic(self.path, "".join(v + "\n" for v in self._lines.values()))
        else:
            self.path.write_text("", encoding="utf-8")

    def __len__(self) -> int:
        return len(self._lines)

    def __contains__(self, key: str) -> bool:
        return key in self._lines

    def get(self, key: str) -> dict | None:
        """A fresh copy of the row stored under ``key``, or None."""
        line = self._lines.get(key)
        return None if line is None else json.loads(line, object_hook=_decode)["row"]

    def add(self, key: str, row: dict) -> None:
        line = json.dumps({"key": key, "row": row}, sort_keys=True, default=_encode)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._lines[key] = line
