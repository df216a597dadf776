"""Times and byte counts for people: `58.6 ms` rather than `58579.89 us`, the unit chosen
by magnitude, three significant digits. Used by the command line's tables (cli.fmt)
and by the progress lines of long jobs; standard library only."""

from __future__ import annotations

import math


def seconds(value: float | None, digits: int = 3) -> str:
    """Seconds as `812 ns`, `41.2 µs`, `58.6 ms` or `2.31 s`, with `digits` significant
    digits (whole numbers keep all of theirs); `-` for None or nan."""
    if value is None or not math.isfinite(value):
        return "-"
    a = abs(value)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if a >= scale:
            return f"{_sig(value / scale, digits)} {unit}"
    return f"{_sig(value * 1e9, digits)} ns" if a else "0 s"


def nbytes(n: float | None, digits: int = 3) -> str:
    """Bytes as `512 B`, `3.15 kB`, `12.6 MB`, `1.07 GB` (powers of 1000)."""
    if n is None or not math.isfinite(n):
        return "-"
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= scale:
            return f"{_sig(n / scale, digits)} {unit}"
    return f"{int(n)} B"


def _sig(x: float, digits: int) -> str:
    """`x` with `digits` significant digits, no exponent, integers as they are."""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"
