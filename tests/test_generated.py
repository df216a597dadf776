"""Every generated results file and document block matches what its generator renders
from the committed artifacts (benchmarks/generated.py lists them)."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.generated import GENERATED, ROOT, Generated, expected, stale


@pytest.mark.parametrize(
    "entry",
    [pytest.param(e, marks=pytest.mark.slow) if e.slow else e for e in GENERATED],
    ids=[e.path + (f"#{e.block}" if e.block else "") for e in GENERATED],
)
def test_generated_file_matches_its_artifact(entry):
    current = (ROOT / entry.path).read_text()
    assert expected(entry, current) == current, (
        f"{entry.path}{' block ' + entry.block if entry.block else ''} is stale: run "
        f"`PYTHONPATH=. python benchmarks/generated.py` (or `{entry.command}`)"
    )


def test_a_stale_table_and_a_stale_block_are_found(tmp_path):
    for path in {e.path for e in GENERATED}:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    table = next(e for e in GENERATED if e.path.endswith("e2e_h100.md"))
    block = next(e for e in GENERATED if e.block)
    # one figure changed in a table, one figure typed by hand into a block
    t = tmp_path / table.path
    text = t.read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| transformer-block |"))
    cells = row.split(" | ")
    cells[3] = str(int(cells[3]) + 1)  # the first timing of the first data row
    t.write_text(text.replace(row, " | ".join(cells), 1))
    d = tmp_path / block.path
    marker = f"<!-- /generated:{block.block} -->"
    d.write_text(d.read_text().replace(marker, "- typed by hand: 1.23x\n" + marker, 1))
    # the entries of those two files (a file's blocks build on each other); the other
    # entries are checked one by one above
    mine = tuple(e for e in GENERATED if e.path in (table.path, block.path))
    found = {(e.path, e.block) for e, _ in stale(tmp_path, entries=mine)}
    assert found == {(table.path, ""), (block.path, block.block)}


def test_a_document_without_its_markers_is_reported():
    entry = next(e for e in GENERATED if e.block)
    with pytest.raises(ValueError, match=f"generated:{entry.block}"):
        expected(entry, "no markers here\n")


def test_a_file_that_is_not_a_benchmarks_rows_is_refused(tmp_path):
    from benchmarks import raw_rows

    bad = tmp_path / "x.json"
    bad.write_text('{"command": "c"}')
    with pytest.raises(SystemExit, match="no 'rows' list"):
        raw_rows.load(bad)
    with pytest.raises(SystemExit, match="cannot read benchmark rows"):
        raw_rows.load(tmp_path / "missing.json")


def test_the_slow_entries_are_left_out_unless_asked(monkeypatch):
    import benchmarks.generated as generated

    calls = []
    slow = Generated("x.md", lambda: calls.append(1) or "", "cmd", slow=True)
    monkeypatch.setattr(generated, "GENERATED", (slow,))
    assert stale() == [] and calls == []


def test_every_committed_plot_is_drawn_from_its_saved_points():
    from benchmarks.generated import stale_plots

    assert stale_plots() == [], "redraw with `PYTHONPATH=. python benchmarks/generated.py`"
