"""Numbers for people in the command line's tables: times in µs, ms or s chosen by size,
bytes in kB/MB/GB, timings as median with spread and a mark when a figure is unstable,
shape buckets as `S 257..512` rather than the cache's `[8,257-512,768]` key.

Standard library and planner.units only: light enough for the CLI's parsers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from planner import units

# A timing whose interquartile range exceeds this share of its median is marked unstable.
MAX_SPREAD = 0.10
UNSTABLE_MARK = "?"
UNSTABLE_NOTE = (
    f"{UNSTABLE_MARK} unstable: the timer did not settle or the spread (IQR) is over "
    f"{MAX_SPREAD:.0%} of the median, or the speed-up's range includes 1.00x; a rerun may "
    "differ (try --threads 1 on a quiet machine)"
)


class TimingLike(Protocol):
    """What the display needs of a timing record (profiling.timer.Timing has it)."""

    median_s: float
    iqr_s: float
    stable: bool


# The one formatter of times and bytes (planner.units), under the names the tables use.
time_s = units.seconds
bytes_ = units.nbytes


def unstable(t: TimingLike) -> bool:
    """Whether a timing is too noisy to compare: not settled, or IQR > MAX_SPREAD."""
    return (not t.stable) or (t.median_s > 0 and t.iqr_s / t.median_s > MAX_SPREAD)


def timing(t: TimingLike | None) -> str:
    """`58.6 ms ±3%` (± half the IQR, relative to the median), with the unstable mark."""
    if t is None:
        return "-"
    half = 0.5 * t.iqr_s / t.median_s if t.median_s else 0.0
    mark = UNSTABLE_MARK if unstable(t) else ""
    return f"{time_s(t.median_s)} ±{100 * half:.0f}%{mark}"


def speedup_range(base: TimingLike, new: TimingLike) -> tuple[float, float, float]:
    """(median ratio, low, high) of base/new, the bounds from each side's quartiles."""
    mid = base.median_s / new.median_s
    lo = (base.median_s - base.iqr_s / 2) / (new.median_s + new.iqr_s / 2)
    hi_den = new.median_s - new.iqr_s / 2
    hi = (base.median_s + base.iqr_s / 2) / hi_den if hi_den > 0 else math.inf
    return mid, lo, hi


def speedup_unstable(base: TimingLike, new: TimingLike) -> bool:
    """Whether the speed-up base/new may not hold on a rerun: either side unstable, or
    the quartile range of the ratio straddles 1 (faster or slower is not settled)."""
    _mid, lo, hi = speedup_range(base, new)
    return unstable(base) or unstable(new) or lo < 1.0 < hi


def speedup(base: TimingLike | None, new: TimingLike | None) -> str:
    """`1.84x` (how much faster `new` is than `base`), marked when it is unstable."""
    if base is None or new is None or not new.median_s:
        return "-"
    mid, _lo, _hi = speedup_range(base, new)
    return f"{mid:.2f}x{UNSTABLE_MARK if speedup_unstable(base, new) else ''}"


def timing_dict(t: Any) -> dict[str, Any]:
    """The JSON form of a timing's display: median, spread, p99 and the unstable flag."""
    if t is None:
        return {}
    return {
        "median_s": t.median_s,
        "iqr_s": t.iqr_s,
        "p99_s": getattr(t, "p99_s", None),
        "reps": getattr(t, "reps", None),
        "unstable": unstable(t),
    }


def bucket(key: str, dims: Sequence[Any] | None = None) -> str:
    """A bucket for people: `S 257..512` (or `B 2..4, S 33..64`) from the cache key
    `[8,257-512,768]` and the spec's dynamic dims (name, input, axis); without dims, the
    ranges of the key alone: `257..512`."""
    kind, colon, rest = key.partition(":")
    if colon and kind in ("bucket", "exact"):  # the cache's entry keys
        return ("exact " if kind == "exact" else "") + bucket(rest, dims)
    shapes = [s.strip("[]").split(",") for s in key.split(";")] if key else []
    named: dict[str, str] = {}
    for d in dims or ():
        name, i, a = (d.name, d.input, d.axis) if hasattr(d, "name") else d
        if i < len(shapes) and a < len(shapes[i]):
            named.setdefault(str(name), _range(shapes[i][a]))
    if named:
        return ", ".join(f"{k} {v}" for k, v in named.items())
    ranges = [_range(d) for s in shapes for d in s if "-" in d]
    return ", ".join(ranges) or key or "-"


def _range(text: str) -> str:
    """`257-512` -> `257..512`; `64-64` -> `64`."""
    lo, dash, hi = text.partition("-")
    return lo if not dash or lo == hi else f"{lo}..{hi}"
