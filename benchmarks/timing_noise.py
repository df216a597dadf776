"""How repeatable are the group timings of a profile dataset? Compares two datasets of the
same units (e.g. one collected with compile workers beside the timer, one without):

    python benchmarks/timing_noise.py data/h100_repeatability/collect2.parquet \
        data/h100_repeatability/collect1.parquet

For the units (same key) in both: the ratio of their medians, overall and for groups under
25 us. For each dataset, restricted to the families and dtypes of the first: the noise
floor of learned_cost.study.evaluate.repeatability (identical groups measured in different
graphs, each predicted by its twins' median) on the twin rows the two have in common.
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow.parquet as pq

from learned_cost.study.evaluate import repeatability

SMALL_S = 25e-6


def rows(path: str) -> list[dict]:
    return [r for r in pq.read_table(path).to_pylist() if r["ok"] and r["kind"] == "group"]


def main(first: str, second: str) -> None:
    a = rows(first)
    fams, dtypes = {r["family"] for r in a}, {r["dtype"] for r in a}
    b = [r for r in rows(second) if r["family"] in fams and r["dtype"] in dtypes]
    by_key = {r["key"]: r for r in b}
    pairs = [(r, by_key[r["key"]]) for r in a if r["key"] in by_key]
    ratio = np.array([x["measured_median_s"] / y["measured_median_s"] for x, y in pairs])
    small = np.array([y["measured_median_s"] < SMALL_S for _, y in pairs])
    print(f"{first}: {len(a)} group rows; {second}: {len(b)} of the same families and dtypes")
    print(f"units in both: {len(pairs)} ({int(small.sum())} under {SMALL_S * 1e6:.0f} us)")
    for label, r in (("all", ratio), ("small", ratio[small]), ("large", ratio[~small])):
        if len(r):
            p10, p50, p90 = np.quantile(r, [0.1, 0.5, 0.9])
            print(
                f"  {label:>5}: first/second median ratio p10 {p10:.2f}, p50 {p50:.2f}, "
                f"p90 {p90:.2f}; mean |ratio - 1| {np.abs(r - 1).mean():.3f}"
            )
    keys = set(by_key) & {r["key"] for r in a}
    for path, data in ((first, a), (second, b)):
        rep = repeatability([r for r in data if r["key"] in keys]).to_dict()
        t = rep.get("twin_median") or {}
        if t:
            print(
                f"{path}: {rep['n_rows']} twin rows in {rep['n_sets']} sets: twins' median "
                f"MAPE {100 * t['mape']:.1f}%, median APE {100 * t['median_ape']:.1f}%, "
                f"p90 APE {100 * t['p90_ape']:.1f}%"
            )


if __name__ == "__main__":
    main(*sys.argv[1:3])
