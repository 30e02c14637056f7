"""Files in and out: JSON read with one-line errors naming the file, and atomic writes (a reader never sees half a
file, an interrupted run leaves the old one)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from planner.errors import InputError


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; a schedule is an ordinary file others should read.
        os.chmod(tmp, p.stat().st_mode & 0o777 if p.exists() else 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


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
