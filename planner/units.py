"""Parsing and formatting of sizes, bandwidths and times.

Decimal prefixes are powers of 1000 (GB), binary prefixes powers of 1024 (GiB), as in SI/IEC.

Text must carry its unit: ``--latency d2h=5`` once meant 5 seconds, silently, where 5 us was meant. The one
exception is a size, where a bare number is bytes (``--hbm 6.4e10``, as docs/usage.md says), and a bare 0, which is
the same in every unit. Python numbers (not text) are in the base unit: bytes, bytes per second, seconds.
"""

from __future__ import annotations

import math
import re

from planner.errors import InputError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]*)\s*$")
_BW_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]*)\s*/\s*s\s*$")
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_TIME_RE = re.compile(rf"^\s*{_NUMBER}\s*(ns|us|ms|s)\s*$")


def parse_size(text: str | int | float, item: str = "size", source: str = "command line") -> int:
    """Return the number of bytes in ``text`` (``64GB``, ``64GiB``, ``512MB``, ``6.4e10``).

    Raises InputError for anything else, for zero and for negative values.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise InputError(source, item, f"{text!r} is not a size (use e.g. 64GB, 64GiB, 512MB or 6.4e10)")
        value, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise InputError(source, item, f"{text!r}: unknown size unit {unit!r} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    size = value * _SIZE_UNITS[unit]
    if not math.isfinite(size) or size <= 0:
        raise InputError(source, item, f"{text!r} must be positive")
    return int(round(size))


def parse_bandwidth(text: str | int | float, item: str = "bandwidth", source: str = "command line") -> float:
    """Return bytes per second for ``text`` (``40GB/s``, ``37.25GiB/s``, ``500B/s``); a Python number is B/s.

    Text without ``/s`` is an error, a bare number too: ``40`` could be GB/s as easily as B/s.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _BW_RE.match(str(text))
        if not m:
            plain = _SIZE_RE.match(str(text))
            hint = " (a bandwidth needs its unit)" if plain and not plain.group(2) else ""
            raise InputError(source, item, f"{text!r} is not a bandwidth{hint}: use e.g. 40GB/s, 37GiB/s or 500B/s")
        value, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise InputError(source, item, f"{text!r}: unknown bandwidth unit {unit!r}/s")
    bw = value * _SIZE_UNITS[unit]
    if not math.isfinite(bw) or bw <= 0:
        raise InputError(source, item, f"{text!r} must be positive")
    return bw


def parse_time(text: str | int | float, item: str = "time", source: str = "command line") -> float:
    """Return seconds for ``text`` (``2us``, ``1.5ms``, ``3s``); a Python number is seconds.

    Text without a unit is an error (``5`` as seconds was the silent misreading of ``--latency d2h=5``), except a
    bare 0, which is the same in every unit.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _TIME_RE.match(str(text))
        if m:
            value = float(m.group(1)) * _TIME_UNITS[m.group(2)]
        else:
            plain = _SIZE_RE.match(str(text))
            if plain and not plain.group(2) and float(plain.group(1)) == 0:
                value = 0.0
            elif plain and not plain.group(2):
                raise InputError(source, item, f"{text!r} has no unit: give one, e.g. {text.strip()}us, "
                                               f"{text.strip()}ms or {text.strip()}s")
            else:
                raise InputError(source, item, f"{text!r} is not a time (use e.g. 2us, 1.5ms, 3s)")
    if not math.isfinite(value) or value < 0:
        raise InputError(source, item, f"{text!r} must be zero or positive")
    return value


def format_bytes(n: float) -> str:
    """Return ``n`` bytes as a short decimal string such as ``61.2 GB``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{sign}{n / scale:.3g} {unit}" if n / scale < 100 else f"{sign}{n / scale:.1f} {unit}"
    return f"{sign}{n:.0f} B"


def format_bytes_exact(n: int) -> str:
    """``n`` bytes short and exact, for notes that compare two sizes: ``1.29 GB (1,290,000,000 B)``."""
    return f"{format_bytes(n)} ({int(n):,} B)" if abs(n) >= 1000 else format_bytes(n)


def format_time_us(us: float) -> str:
    """Return a duration given in microseconds as a short string (``1.25 ms``)."""
    if us >= 1e6:
        return f"{us / 1e6:.4g} s"
    if us >= 1e3:
        return f"{us / 1e3:.4g} ms"
    return f"{us:.4g} us"
