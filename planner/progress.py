"""Progress of long jobs (tuning, collection, training, search), shown on stderr.

On a terminal a job shows a tqdm bar with its rate and ETA, and message lines are written
above the bar; elsewhere (CI logs, files) it writes a plain line at most every
`interval_s` seconds and one at the end, so a log stays short and still says how far the
job got. Every long loop in the project reports through this module:

    with progress.bar(len(buckets), "tune", unit="bucket") as bar:
        for b in buckets:
            bar.note(b.key)         # what is being done now (postfix / plain-line suffix)
            ...
            bar.update()
    progress.say("bucket 3 failed: ...")  # a message, never mixed into the bar

The command line sets the mode once (`configure`): `-q` turns bars and messages off,
`--progress plain` forces plain lines. The module lives in `planner` (the bottom layer) so
`profiling`, `learned_cost` and `search` share it; it imports tqdm only when a bar opens
on a terminal, and nothing else beyond the standard library.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

MODES = ("auto", "bar", "plain", "off")


@dataclass
class _Settings:
    mode: str = "auto"  # auto: a bar when the stream is a terminal, else plain lines
    interval_s: float = 10.0  # plain mode: seconds between lines
    stream: TextIO | None = None  # None: sys.stderr at the time of writing


_settings = _Settings()
_open_bars: list[Bar] = []


def configure(
    mode: str = "auto", *, interval_s: float = 10.0, stream: TextIO | None = None
) -> None:
    """Set how progress is shown: "auto", "bar", "plain" or "off" (see the module doc)."""
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {MODES}, got {mode!r}")
    _settings.mode, _settings.interval_s, _settings.stream = mode, interval_s, stream


def _stream() -> TextIO:
    return _settings.stream or sys.stderr


def _mode() -> str:
    if _settings.mode != "auto":
        return _settings.mode
    isatty = getattr(_stream(), "isatty", None)
    return "bar" if isatty is not None and isatty() else "plain"


def say(line: str) -> None:
    """Write one message line: above an open bar on a terminal, else as a plain line;
    nothing when progress is off."""
    if _mode() != "off":
        write(line, _stream())


def write(line: str, stream: TextIO) -> None:
    """Write `line` to `stream` without breaking an open bar (log records use this)."""
    if _open_bars and _open_bars[-1]._tqdm is not None:
        _open_bars[-1]._tqdm.write(line, file=stream)
        return
    print(line, file=stream, flush=True)


def format_duration(seconds: float) -> str:
    """A duration for people: 42s, 3m05s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Bar:
    """One job's progress: `update(n)` counts work done, `note(text)` says what runs now.

    Not thread-safe: one thread updates a bar. `total` may be None (unknown): the bar
    then counts without a percentage or ETA."""

    def __init__(self, total: int | None, desc: str, unit: str, mode: str) -> None:
        self.total, self.desc, self.unit, self.mode = total, desc, unit, mode
        self.n = 0
        self._note = ""
        self._t0 = time.monotonic()
        self._last_line = self._t0
        self._tqdm: Any = None
        if mode == "bar":
            from tqdm.auto import tqdm

            size = shutil.get_terminal_size((100, 20))
            nested = bool(_open_bars)  # an inner bar (a search inside a bucket) goes away
            self._tqdm = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                file=_stream(),
                # a terminal that reports no size (a pty under `script`, some CI runners)
                # would hide every bar (0 rows): fall back to 100 x 20
                ncols=size.columns,
                nrows=size.lines,
                leave=not nested,
            )

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._tqdm is not None:
            self._tqdm.update(n)
        elif self.mode == "plain" and time.monotonic() - self._last_line >= _settings.interval_s:
            self._plain_line()

    def note(self, text: str) -> None:
        self._note = text
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(text[:60], refresh=True)

    def line(self) -> str:
        """The plain-mode line: `desc: 3/10 buckets (30%), 1m20s elapsed, ETA 3m07s; note`."""
        elapsed = time.monotonic() - self._t0
        done = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        parts = [f"{self.desc}: {done} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts.append(f"{format_duration(elapsed)} elapsed")
        if self.total and 0 < self.n < self.total:
            parts.append(f"ETA {format_duration(elapsed / self.n * (self.total - self.n))}")
        text = ", ".join(parts)
        return f"{text}; {self._note}" if self._note else text

    def _plain_line(self) -> None:
        self._last_line = time.monotonic()
        print(self.line(), file=_stream(), flush=True)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.mode == "plain" and time.monotonic() - self._t0 >= _settings.interval_s:
            self._note = ""  # a last line for a job long enough to have had progress lines
            self._plain_line()

    def __enter__(self) -> Bar:
        _open_bars.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _open_bars.remove(self)
        self.close()


def bar(total: int | None, desc: str, *, unit: str = "it") -> Bar:
    """A progress bar for `total` units of work (use it as a context manager)."""
    return Bar(total, desc, unit, _mode())


def track(
    items: Iterable[Any], desc: str, *, total: int | None = None, unit: str = "it"
) -> Iterator[Any]:
    """Iterate `items` with a bar that advances after each item."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with bar(total, desc, unit=unit) as b:
        for item in items:
            yield item
            b.update()
