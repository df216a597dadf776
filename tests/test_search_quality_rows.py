"""benchmarks/search_quality.py renders its markdown from its saved rows alone: the
modelled benchmark's targets follow the rows, the encoding study's table has one column per
variant, `--from-json` renders the saved file again, and a reduced run says so."""

from __future__ import annotations

from benchmarks import raw_rows
from benchmarks import search_quality as sq

NAMES = ("greedy", "priority", "exact", "tpe", "rl", "rl-ft")


def quality_run(tpe_s: float, quick: bool = False) -> dict:
    costs = {"greedy": 2.0, "priority": 1.0, "exact": 1.0, "tpe": tpe_s, "rl": 1.0, "rl-ft": 1.0}
    row = sq.Row("g", 12, "yes", 3.0, {n: (costs[n], 0.5, True, "") for n in NAMES}, "exact", 1.0)
    return {
        "benchmark": "search_quality",
        "command": "python benchmarks/search_quality.py",
        "machine": "test",
        "settings": {"quick": quick},
        "total_seconds": 3.0,
        "rows_file": "search_quality.json",
        "rows": [sq.row_dict(row)],
    }


def test_the_targets_follow_the_rows():
    met = sq.render(quality_run(1.0))
    missed = sq.render(quality_run(1.02))
    assert "- tpe within 1% of exact on every graph of <= 30 ops: met" in met
    assert "- tpe within 1% of exact on every graph of <= 30 ops: NOT met" in missed
    assert "Raw rows: `search_quality.json` beside this file." in met
    assert "Settings other than the defaults" not in met
    assert "Settings other than the defaults: `--quick`" in sq.render(quality_run(1.0, True))


def test_a_row_round_trips_through_its_dict():
    row = sq.row_from_dict(quality_run(1.5)["rows"][0])
    assert row.results["tpe"] == (1.5, 0.5, True, "") and row.reference == "exact"


def test_the_encoding_study_has_a_column_per_variant_and_a_mean():
    rows = [
        {"graph": f"random-{n}", "nodes": n, "seed": n, "variant": v, "total_s": t,
         "priority_s": 1.0, "decisions": 3, "seconds": 1.0}
        for n in (100, 250) for v, t in (("a", 0.9), ("b", 1.0))
    ]  # fmt: skip
    run = {
        "benchmark": "encoding_study",
        "command": "c",
        "machine": "m",
        "settings": {"quick": False, "trials": 7},
        "total_seconds": 1.0,
        "rows_file": "encoding_study.json",
        "rows": rows,
    }
    table = [ln for ln in sq.render(run).splitlines() if ln.startswith("|")]
    assert table[0] == "| graph | ops | a | b |"
    assert table[2] == "| random-100 | 100 | -10.00% (k=3, 1s) | +0.00% (k=3, 1s) |"
    assert table[-1] == "| mean | | -10.00%, better on 2/2 | +0.00%, better on 0/2 |"


def test_from_json_renders_the_saved_rows(tmp_path, capsys):
    run = quality_run(1.0)
    path = raw_rows.save(tmp_path / "search_quality.json", run)
    assert sq.main(["--from-json", str(path)]) == 0
    assert capsys.readouterr().out == sq.render(run)
