"""Run `fusion-plan cost heldout ARGS` in-process and also score every model on subsets of
the held-out rows (zoo rows only, real-model rows only), from the same out-of-fold
predictions the study scores. A probe: it wraps the study's internals (nested_cv, the fold
dealer, group_rows) for one experiment, adding real-model rows as training architectures.

    PYTHONPATH=. python benchmarks/probes/heldout_subsets.py OUT.json [--strip-v4]
        [--fixed-zoo-folds] -- cost heldout --data A.parquet,B.parquet ...

--strip-v4: drop the descriptor fields only version-4 rows carry, so rows of both files are
built from the same fields (older rows read a missing field as 0).
--fixed-zoo-folds: the zoo architectures' folds are a zoo-only study's (same seed), and
every other architecture is always in training, never scored.

    PYTHONPATH=. python benchmarks/probes/heldout_subsets.py --render learned_cost/studies/real_rows

prints the committed runs' comparison (docs/learned_cost.md has it as a generated block)."""

import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

# the committed runs, in the order compared: what each one trained on
RUNS = (
    ("subsets_base", "zoo rows only"),
    ("subsets_aug", "with the real-model rows, dealt into the folds as six more architectures"),
    (
        "subsets_fixed",
        "with the real-model rows always in training; the zoo's folds as in the first",
    ),
    (
        "subsets_fixedstrip",
        "as the third, the rows' descriptor fields matched (no version-4 fields)",
    ),
)
MODELS = ("gbt+twins", "mlp-mixed+twins", "mlp-free+twins")
SUBSETS = (("zoo", "zoo architectures"), ("real", "real-model architectures"))


def render_text(folder: Path) -> str:
    """A Markdown table of the committed runs in `folder`: per run and scored subset (the
    real-model rows only where they were held out), each model's MAPE (mean and range over
    the fold seeds) and within-graph Kendall tau (mean)."""

    def cell(vals: list[float], pct: bool) -> str:
        m = statistics.fmean(vals)
        if pct:
            return f"{100 * m:.1f}% ({100 * min(vals):.1f}..{100 * max(vals):.1f})"
        return f"{m:.3f}"

    head = "| training rows | scored | rows | " + " | ".join(
        f"{m} MAPE | {m} tau within" for m in MODELS
    )
    lines = [head + " |", "|---|---|---|" + "---|---|" * len(MODELS)]
    seen: set[int] = set()  # fold seeds over the runs
    for name, what in RUNS:
        run = json.loads((folder / f"{name}.json").read_text())
        seen.update(s["seed"] for s in run["seeds"])
        for key, label in SUBSETS:
            if key == "real" and run.get("fixed_zoo_folds"):
                continue  # always in training there: never predicted out of fold
            seeds = [s for s in run["seeds"] if key in s["subsets"]]
            if not seeds:
                continue
            n = seeds[0]["subsets"][key][MODELS[0]]["n"]
            cells = []
            for m in MODELS:
                got = [s["subsets"][key][m] for s in seeds]
                cells.append(cell([g["mape"] for g in got], True))
                cells.append(cell([g["kendall_tau_within"] for g in got], False))
            lines.append(f"| {what} (`{name}.json`) | {label} | {n} | " + " | ".join(cells) + " |")
    return (
        f"Held out by architecture, fold seeds {sorted(seen)}; MAPE as mean (range) over the "
        "seeds, tau within graph as mean.\n\n" + "\n".join(lines) + "\n"
    )


def main() -> int:
    if sys.argv[1] == "--render":
        print(render_text(Path(sys.argv[2])), end="")
        return 0
    import numpy as np

    from learned_cost.study import heldout, heldout_report
    from learned_cost.study.evaluate import group_metrics

    out_path = sys.argv[1]
    strip = "--strip-v4" in sys.argv[2 : sys.argv.index("--")]
    # --fixed-zoo-folds: the zoo architectures' folds are those of a zoo-only study (same seed),
    # and every other architecture is in training in every fold (outer and inner), never scored
    fixed = "--fixed-zoo-folds" in sys.argv[2 : sys.argv.index("--")]
    argv = sys.argv[sys.argv.index("--") + 1 :]

    V4_ONLY = (
        "desc_op_bytes_read",
        "desc_op_bytes_written",
        "desc_anchor_tiles",
        "desc_gemm_pad_ratio",
        "desc_anchor_batch",
        "desc_red_len_max",
        "desc_red_rows_min",
        "desc_red_noncontig",
        "desc_n_reduction_shapes",
    )
    if strip:
        _group_rows = heldout_report.group_rows

        def group_rows(profiles, device=None, **kw):
            return [
                {k: v for k, v in r.items() if k not in V4_ONLY}
                for r in _group_rows(profiles, device, **kw)
            ]

        heldout_report.group_rows = group_rows

    records = []
    _nested = heldout.nested_cv

    def nested_cv(rows, spec_for, **kw):
        res = _nested(rows, spec_for, **kw)
        cv = res.cv
        zoo = np.array([str(r.get("model")).startswith("zoo:") for r in rows])
        n_v4 = sum(any(k in r for k in V4_ONLY) for r in rows)
        rec = {
            "seed": kw.get("seed"),
            "n_rows": len(rows),
            "n_zoo": int(zoo.sum()),
            "rows_with_v4_fields": n_v4,
            "subsets": {},
        }
        for subset, mask in (("all", np.ones(len(rows), bool)), ("zoo", zoo), ("real", ~zoo)):
            if not mask.any():
                continue
            rec["subsets"][subset] = {
                name: asdict(
                    group_metrics(
                        cv.predicted_s(name)[mask], cv.design.measured_s[mask], cv.graph_ids[mask]
                    )
                )
                for name in cv.oof_log_ratio
            }
        records.append(rec)
        return res

    heldout.nested_cv = nested_cv

    if fixed:
        _shuffled = heldout.shuffled_group_folds
        _cross_validate = heldout.cross_validate

        def is_zoo(keys):
            return np.array([str(k).startswith("zoo.") for k in keys.tolist()])

        def shuffled_group_folds(seed):
            base = _shuffled(seed)

            def split(keys, n_splits):
                zoo = is_zoo(keys)
                zi, ri = np.flatnonzero(zoo), np.flatnonzero(~zoo)
                for tr, te in base(keys[zoo], n_splits):
                    yield np.sort(np.concatenate([zi[tr], ri])), zi[te]

            return split

        def cross_validate(rows, spec_for, **kw):
            cv = _cross_validate(rows, spec_for, **kw)
            cv.fold[~is_zoo(cv.design.groups)] = -1  # in every fold's training rows
            return cv

        heldout.shuffled_group_folds = shuffled_group_folds
        heldout.cross_validate = cross_validate
    from cli.main import main as cli_main

    rc = cli_main(argv)
    with open(out_path, "w") as f:
        json.dump(
            {"argv": argv, "strip_v4": strip, "fixed_zoo_folds": fixed, "seeds": records},
            f,
            indent=1,
            default=float,
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
