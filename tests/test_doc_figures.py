"""No measured figure is typed by hand into the prose of a document: a ratio (`1.4x`), a
count of cells (`5 of 20`), a time (`93.6 µs`) or a percentage outside a generated block
(benchmarks/generated.py checks those) and outside code fences fails here, naming its
file and line. The few legitimate ones (a formula's constant, a configured default, a
target, a format example) are listed in ALLOWED with the reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.generated import GENERATED

ROOT = Path(__file__).resolve().parents[1]

# The documents whose prose is scanned.
DOC_GLOBS = (
    "README.md",
    "docs/*.md",
    "benchmarks/README.md",
    "data/README.md",
    "benchmarks/results/*/README.md",
)
# Whole documents written by a generator (checked against it elsewhere).
WHOLLY_GENERATED = {e.path for e in GENERATED if not e.block} | {"docs/worked_examples.md"}
# Documents left out as a whole, with the reason.
ALLOWED_FILES: set[str] = set()

FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?\s?[x×](?!\w)"  # a ratio: 1.4x, 18 x
    r"|(?<![\w.])\d[\d,]* of \d[\d,]*\b"  # a count: 5 of 20 cells
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:µs|us|ms|ns)\b"  # a time: 93.6 µs
    r"|(?<![\w.])\d+(?:\.\d+)?\s?%"  # a percentage
)

# (file, exact text around the figure, why it is not a measurement). Keep it short: a
# measured figure belongs in a generated block or in its results file, not here.
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("docs/cli.md", "`tune: 3/8 bucket (38%)", "an example of the progress line's format"),
    ("docs/cli.md", "(`58.6 ms`, not `58579.89 us`)", "examples of the time format"),
    ("docs/cli.md", "(`18.2 µs ±3%`)", "an example of the median ±IQR format"),
    ("docs/cli.md", "exceeds 10% of its median", "the timer's stability threshold"),
    ("docs/cli.md", "includes 1.00x", "the ratio that means no change"),
    ("docs/design_notes.md", "5% target", "the plan-error target of docs/learned_cost.md"),
    ("docs/distributed.md", "The α values (3-5 us)", "the link table's priors, not measured"),
    ("docs/distributed.md", "2x its forward time", "dp.BACKWARD_FACTOR, a constant"),
    ("docs/distributed.md", "`dp.BACKWARD_FACTOR` = 2x", "dp.BACKWARD_FACTOR, a constant"),
    ("docs/distributed.md", "the seed's 100 ns local, 150 ns remote", "numa.two_node()'s values"),
    ("docs/distributed.md", "scaled so local = 100 ns", "numa.os_topology()'s scaling"),
    ("docs/distributed.md", "pages · 2 us", "the migration model's per-page constant"),
    ("docs/distributed.md", "held out at 1.5x each power of two", "where the fit is held out"),
    ("docs/distributed.md", "also on 1.25x and", "where the fit is trained"),
    ("docs/distributed.md", "1.75x each power of two, which", "where the fit is trained"),
    ("docs/distributed.md", "a 15% held-out bound", "a target"),
    ("docs/distributed.md", "(4x or 8/3x more)", "the MLP widths of the architectures"),
    ("docs/distributed.md", "(9 + 22 us against 32 us", "costs set by hand in a test"),
    ("docs/distributed.md", "within 10%", "the table's criterion"),
    ("docs/formulas.md", "(e.g. 100 ns and 150 ns)", "an example of a latency matrix"),
    ("docs/report.md", "(1.5x the largest)", "the chart's scale rule"),
    ("docs/search.md", "a 0.95x merge keeps 36% of the weight, a 0.8x merge 1%)", "arithmetic"),
    ("data/README.md", "2 x 215 s", "the calls' timeouts"),
    ("docs/distributed.md", "two-node machine (100 ns / 150 ns,", "numa.two_node()'s values"),
    ("docs/runtime.md", "at most 2x between a shape", "what pow2 buckets guarantee"),
    ("docs/runtime.md", "never more than 2x off", "what pow2 buckets guarantee"),
    ("docs/runtime.md", "saved under 5% on average", "specialize.MIN_GAIN, a constant"),
    ("docs/runtime.md", "an L1 hit <= 10 us, an L2 hit <= 500 us", "the lookup targets"),
)


def documents(root: Path = ROOT) -> list[Path]:
    paths = {p for g in DOC_GLOBS for p in root.glob(g)}
    return sorted(
        p for p in paths if str(p.relative_to(root)) not in WHOLLY_GENERATED | ALLOWED_FILES
    )


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the prose: outside generated blocks and code fences."""
    out, block, fence = [], False, False
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if re.fullmatch(r"<!-- generated:\S+ -->", s):
            block = True
        elif re.fullmatch(r"<!-- /generated:\S+ -->", s):
            block = False
        elif s.startswith("```"):
            fence = not fence
        elif not block and not fence:
            out.append((n, line))
    return out


def _loose(text: str) -> re.Pattern[str]:
    """`text` exactly, except that any run of white space matches any other (a line break
    and the next line's indent included)."""
    return re.compile(r"\s+".join(re.escape(w) for w in text.split()))


def figures(path: str, text: str) -> list[tuple[int, str, str]]:
    """(line, figure, line text) of every figure in the prose of `text` that no ALLOWED
    entry of `path` covers. An entry covers a figure when its text (which may run over a
    line break: white space matches white space) contains it, where it stands."""
    spans = []  # character spans of the allowed texts
    for file, allowed, _ in ALLOWED:
        if file == path:
            spans += [(m.start(), m.end()) for m in _loose(allowed).finditer(text)]
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    out = []
    for n, line in prose_lines(text):
        for m in FIGURE.finditer(line):
            a, b = starts[n - 1] + m.start(), starts[n - 1] + m.end()
            if not any(lo <= a and b <= hi for lo, hi in spans):
                out.append((n, m.group(0), line.strip()))
    return out


def test_no_measured_figure_is_typed_into_prose():
    found = [
        f"{p.relative_to(ROOT)}:{n}: {fig!r} in: {line[:120]}"
        for p in documents()
        for n, fig, line in figures(str(p.relative_to(ROOT)), p.read_text())
    ]
    assert not found, (
        "measured figures typed by hand (put them in a generated block, "
        "benchmarks/generated.py, or state the finding and point to the results file; "
        "a figure that is not a measurement goes into ALLOWED with its reason):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize("entry", ALLOWED, ids=[f"{f}:{t[:30]}" for f, t, _ in ALLOWED])
def test_every_allowed_text_is_still_in_its_document(entry):
    path, text, _ = entry
    assert _loose(text).search((ROOT / path).read_text()), (
        f"{path} no longer holds {text!r}: drop the entry"
    )


def test_the_scan_finds_figures_in_prose_only():
    text = (
        "It ran 1.4x faster, lost in 5 of 20 cells, took 93.6 µs and 12% more.\n"
        "<!-- generated:x -->\nIn a block: 2.5x, 7 ms.\n<!-- /generated:x -->\n"
        "```\n$ example 3.1x 4 ms\n```\n"
        "No figure: B=8, 2^28, 773 TFLOP/s, 3/8, v2.0, sm90x.\n"
    )
    got = [(n, fig) for n, fig, _ in figures("nowhere.md", text)]
    assert got == [(1, "1.4x"), (1, "5 of 20"), (1, "93.6 µs"), (1, "12%")]


def test_an_allowed_text_covers_its_figure_and_no_other():
    path, allowed, _ = ALLOWED[0]
    text = f"{allowed}\nand 38% elsewhere\n"
    assert [fig for _, fig, _ in figures(path, text)] == ["38%"]
