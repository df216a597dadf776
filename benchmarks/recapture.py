"""Do the committed profile rows still recapture to the graphs they were measured on?

    PYTHONPATH=. python benchmarks/recapture.py data/h100_profiles.parquet data/cpu_profiles.parquet

Per dataset: each distinct (model, shape, dtype) is captured again with today's code, as
the learned-cost study does (`GraphCache`: meta first, then CPU tensors), and its key
compared with the rows' stored graph_key: equal, equal to the key the graph had under an
earlier capture that differed only in backend-dependent outputs
(`planner.ir.backend_forms.former_keys`), or neither (the graph changed; the study skips
such rows). Prints one table; about a quarter of a second per graph on a CPU.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter

import pyarrow.parquet as pq

from learned_cost.study.plan_eval import GraphCache

COLUMNS = ["kind", "model", "family", "shape", "dtype", "graph_key"]


def check(path: str) -> dict[str, Counter]:
    """Counts of graphs, rows and plan rows by how they match: exact, former, none."""
    rows = pq.read_table(path, columns=COLUMNS).to_pylist()
    graphs = GraphCache()
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="+", help="profile datasets (Parquet)")
    args = ap.parse_args(argv)
    print("| dataset | what | total | same key | former key | no match |")
    print("|---|---|---|---|---|---|")
    unmatched = 0
    for path in args.data:
        got = check(path)
        for what in ("graphs", "rows", "plan rows"):
            c = got[what]
            print(
                f"| {path} | {what} | {sum(c.values())} | {c['exact']} | {c['former']} "
                f"| {c['none']} |"
            )
        unmatched += got["graphs"]["none"]
        if got["unmatched families"]:
            fams = ", ".join(f"{f} {n}" for f, n in sorted(got["unmatched families"].items()))
            print(f"\nunmatched rows of {path} by family: {fams}\n", file=sys.stderr)
    return 1 if unmatched else 0


if __name__ == "__main__":
    sys.exit(main())
