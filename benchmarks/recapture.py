"""Do the committed profile rows still recapture to the graphs they were measured on?

    PYTHONPATH=. python benchmarks/recapture.py data/*.parquet

Per dataset: each distinct (model, shape, dtype) is captured again with today's code, as
the learned-cost study does (`GraphCache`: meta first, then CPU tensors), and its key
compared with the rows' stored graph_key: equal, equal to the key the graph had under an
earlier capture that differed only in backend-dependent outputs
(`planner.ir.backend_forms.former_keys`), or neither (the graph changed; the study skips
such rows). Prints one table (data/README.md keeps it, checked by the slow generated
tests); about a quarter of a second per graph on a CPU, a few minutes in all.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from learned_cost.study.plan_eval import GraphCache

COLUMNS = ["kind", "model", "family", "shape", "dtype", "graph_key"]


def check(path: str, graphs: GraphCache | None = None) -> dict[str, Counter]:
    """Counts of graphs, rows and plan rows by how they match: exact, former, none.
    `graphs` may be shared between datasets: a graph is captured once."""
    rows = pq.read_table(path, columns=COLUMNS).to_pylist()
    graphs = graphs or GraphCache()
    how: dict[tuple[str, str, str, str], str] = {}
    for r in rows:
        k = (r["model"], r["shape"] or "", r["dtype"], r["graph_key"])
        if k in how:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = graphs.get(r)
        if g is None:
            how[k] = "none"
        else:
            how[k] = "exact" if g.key == r["graph_key"] else "former"
    out = {"graphs": Counter(how.values()), "rows": Counter(), "plan rows": Counter()}
    for r in rows:
        m = how[(r["model"], r["shape"] or "", r["dtype"], r["graph_key"])]
        out["rows"][m] += 1
        if r["kind"] == "plan":
            out["plan rows"][m] += 1
    out["unmatched families"] = Counter(
        r["family"]
        for r in rows
        if how[(r["model"], r["shape"] or "", r["dtype"], r["graph_key"])] == "none"
    )
    return out


def table(paths: list[str]) -> str:
    """One markdown table of `check` over the datasets, with the unmatched families."""
    lines = [
        "| dataset | what | total | same key | former key | no match |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    graphs = GraphCache()
    for path in paths:
        got = check(path, graphs)
        for what in ("graphs", "rows", "plan rows"):
            c = got[what]
            lines.append(
                f"| `{Path(path).name}` | {what} | {sum(c.values())} | {c['exact']} "
                f"| {c['former']} | {c['none']} |"
            )
        if got["unmatched families"]:
            fams = ", ".join(f"{f} {n}" for f, n in sorted(got["unmatched families"].items()))
            notes.append(f"- rows of `{Path(path).name}` matching no graph, by family: {fams}")
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="+", help="profile datasets (Parquet)")
    args = ap.parse_args(argv)
    text = table(args.data)
    sys.stdout.write(text)
    return 1 if "matching no graph" in text else 0


if __name__ == "__main__":
    sys.exit(main())
