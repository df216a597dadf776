"""`fusion-plan cost train|eval|report`: the learned correction of the analytical model.

- `train`: grouped cross-validation of every model side by side (analytical, mean-bias,
  ridge, gradient-boosted trees, MLP free, roofline-bounded and the two mixed), the MLP
  form chosen, fitted on all rows, saved (JSON + npz) with its metrics; writes the
  predicted-vs-measured PNG. One command does everything:
  `fusion-plan cost train --data data/h100_profiles.parquet --device h100
   --out learned_cost/models/h100.json`
- `eval`: the same side-by-side table and plot without saving a model (with `--model`,
  the MLP rows use that model's hyper-parameters).
- `adapt`: a saved model (another device's) adapted to a few rows of this device, saved
  as a model for it (learned_cost/adapt.py).
- `adapt-study`: held-out error on the new device against the number of its rows used,
  adapted against trained from scratch (learned_cost/study/adapt_curve.py).
- `report`: docs/learned_cost.md from saved models' metadata (no retraining).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from learned_cost.data import data_paths, group_rows, load_profiles
from learned_cost.features import FEATURES, SCHEMA_HASH
from learned_cost.persist import ModelMeta, load_model, read_meta
from learned_cost.study.evaluate import MODELS
from learned_cost.study.heldout import StudyConfig
from learned_cost.study.heldout_report import heldout_study, read_study, render_study
from learned_cost.study.train import (
    SPLIT_LABELS,
    TrainConfig,
    committed_name,
    evaluate_all,
    plot_predictions,
    render_run,
    train,
)
from planner import hardware
from planner.errors import CostModelError
from planner.hardware import cache_dir
from search.cost_models import COMMITTED_DIR

STUDIES_DIR = COMMITTED_DIR.parent / "studies"


def _config(args: argparse.Namespace, params: dict | None = None) -> TrainConfig:
    device = (args.device or hardware.local_device_name()).lower()
    mlp_params = dict(params or {})
    if args.steps is not None:
        mlp_params["steps"] = args.steps
    if args.dropout is not None:
        mlp_params["dropout"] = args.dropout
    if args.hidden is not None:
        mlp_params["hidden"] = args.hidden
    return TrainConfig(
        device=device,
        form=args.form,
        splits=tuple(s.strip() for s in args.split.split(",") if s.strip()),
        n_splits=args.folds,
        seed=args.seed,
        mlp_params=mlp_params,
        twins=not args.no_twins,
    )


def _command(args: argparse.Namespace, cfg: TrainConfig, out: str) -> str:
    parts = ["fusion-plan", "cost", args.verb]
    for d in args.data:
        parts += ["--data", d]
    parts += ["--device", cfg.device, "--split", ",".join(cfg.splits), "--folds", str(args.folds)]
    parts += ["--seed", str(args.seed), "--form", args.form]
    if args.steps is not None:
        parts += ["--steps", str(args.steps)]
    if args.dropout is not None:
        parts += ["--dropout", f"{args.dropout:g}"]
    if args.hidden is not None:
        parts += ["--hidden", ",".join(map(str, args.hidden))]
    if args.no_twins:
        parts.append("--no-twins")
    parts += ["--out", out]
    return shlex.join(parts)


def run_train(args: argparse.Namespace) -> int:
    cfg = _config(args)
    out = args.out or str(cache_dir() / "models" / f"{cfg.device}.json")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    plot = args.plot or str(Path(out).with_suffix(".png"))
    profiles = load_profiles(args.data)
    _, run, meta, form = train(profiles, cfg, out, command=_command(args, cfg, out), plot=plot)
    assert meta is not None
    if args.format == "json":
        json.dump(meta.to_json(), sys.stdout, indent=2, default=float)
        sys.stdout.write("\n")
        return 0
    name = committed_name(form, cfg.twins)
    print(render_run(run, name))
    print(f"\nchose mlp-{form}; saved {name} as {meta.model_id} to {out} (+ .npz); plot {plot}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    params = None
    if args.model:
        meta = read_meta(args.model)
        params = {
            k: v for k, v in meta.params.items() if k not in ("form", "random_state", "twins")
        }
        params["hidden"] = tuple(params.get("hidden", (64, 64)))
    cfg = _config(args, params)
    profiles = load_profiles(args.data)
    run = evaluate_all(profiles, cfg)
    plot = args.plot
    if plot:
        plot_predictions(run.splits[0], plot, title=cfg.device)
    if args.format == "json":
        payload = {
            "device": run.device,
            "splits": {sr.split: [s.to_dict() for s in sr.scores] for sr in run.splits},
            "plot": plot,
        }
        json.dump(payload, sys.stdout, indent=2, default=float)
        sys.stdout.write("\n")
        return 0
    form = args.form if args.form != "auto" else None
    print(render_run(run, committed_name(form, cfg.twins) if form else None))
    if plot:
        print(f"\nplot: {plot}")
    return 0


def run_heldout(args: argparse.Namespace) -> int:
    device = (args.device or hardware.local_device_name()).lower()
    params: dict = {}
    if args.model:
        meta = read_meta(args.model)
        params = {
            k: v for k, v in meta.params.items() if k not in ("form", "random_state", "twins")
        }
        params["hidden"] = tuple(params.get("hidden", (64, 64)))
    if args.steps is not None:
        params["steps"] = args.steps
    if args.members is not None:
        params["n_members"] = args.members
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        raise CostModelError(f"--seeds takes integers like 0,1,2; got {args.seeds!r}") from None
    cfg = StudyConfig(
        splits=tuple(s.strip() for s in args.split.split(",") if s.strip()),
        seeds=seeds,
        n_splits=args.folds,
        inner_splits=args.inner_folds,
        mlp_params=params,
        baseline_params={"gbt": {"n_estimators": args.gbt_trees}} if args.gbt_trees else {},
    )
    out = Path(args.out or cache_dir() / "studies" / f"{device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = _heldout_command(args, device, out)

    ref = {"path": args.model, "params": read_meta(args.model).params} if args.model else None

    def write(record: dict) -> None:  # after every (split, seed): a cut-short run keeps them
        record = {**record, "command": command, "reference_model": ref}
        out.write_text(json.dumps(record, indent=1, default=float) + "\n")

    study = heldout_study(
        data_paths(args.data),
        device,
        cfg,
        limit_rows=args.limit_rows,
        on_progress=write,
        recapture=not args.stored_descriptors,
    )
    write(study)
    print(render_study({**study, "command": command}))
    print(f"\nwrote {out}")
    return 0


def _heldout_command(args: argparse.Namespace, device: str, out: Path) -> str:
    parts = ["fusion-plan", "cost", "heldout"]
    for d in args.data:
        parts += ["--data", d]
    parts += ["--device", device, "--split", args.split, "--seeds", args.seeds]
    parts += ["--folds", str(args.folds), "--inner-folds", str(args.inner_folds)]
    for flag, v in (
        ("--model", args.model),
        ("--steps", args.steps),
        ("--members", args.members),
        ("--gbt-trees", args.gbt_trees),
        ("--limit-rows", args.limit_rows),
    ):
        if v is not None:
            parts += [flag, str(v)]
    if args.stored_descriptors:
        parts.append("--stored-descriptors")
    return shlex.join([*parts, "--out", str(out)])


# ---- another device ----------------------------------------------------------------------------
def _target_rows(args: argparse.Namespace) -> tuple[list[dict], object]:
    """The usable group rows of --device in --data (descriptors recomputed unless
    --stored-descriptors), and the profiles they came from."""
    from learned_cost.study.plan_eval import GraphCache, current_descriptors

    profiles = load_profiles(args.data)
    rows = group_rows(profiles, device=args.device)
    if not rows:
        devices = sorted({str(r.get("device")) for r in profiles.rows})
        raise CostModelError(
            f"no usable group rows of device {args.device!r} in {args.data} (devices there: "
            f"{devices}); pass the --device the rows were measured on"
        )
    if not args.stored_descriptors:
        rows = current_descriptors(rows, GraphCache())
    return rows, profiles


def _adapt_command(args: argparse.Namespace, verb: str, out: Path, extra: list[str]) -> str:
    parts = ["fusion-plan", "cost", verb, "--model", args.model]
    for d in args.data:
        parts += ["--data", d]
    parts += ["--device", args.device, *extra]
    if args.steps is not None:
        parts += ["--steps", str(args.steps)]
    if args.lr != 1e-3:
        parts += ["--lr", f"{args.lr:g}"]
    if args.stored_descriptors:
        parts.append("--stored-descriptors")
    return shlex.join([*parts, "--out", str(out)])


def run_adapt(args: argparse.Namespace) -> int:
    from learned_cost.adapt import AdaptConfig, adapt_saved

    source, meta = load_model(args.model)
    spec = hardware.get_spec(args.device)
    rows, profiles = _target_rows(args)
    if args.rows:
        rows = rows[: args.rows]
    cfg = AdaptConfig(method=args.method, steps=args.steps, lr=args.lr, twins=not args.no_twins)
    out = Path(args.out or cache_dir() / "models" / f"{spec.name}.json")
    extra = ["--method", args.method]
    if args.rows:
        extra += ["--rows", str(args.rows)]
    if args.no_twins:
        extra.append("--no-twins")
    command = _adapt_command(args, "adapt", out, extra)
    new, summary = adapt_saved(
        source, meta, rows, spec, cfg, out, data_files=profiles.sources, command=command
    )
    a = summary["adaptation"]
    print(
        f"adapted {meta.model_id} ({meta.device}) to {spec.name} with {a['n_rows']} group rows "
        f"of {a['n_graphs']} graphs, method {a['method']} ({a['steps']} steps): log-bias "
        f"{a['bias']:+.3f}; in-sample MAPE {100 * a['in_sample_mape_source']:.1f}% -> "
        f"{100 * a['in_sample_mape_adapted']:.1f}% (a fit, not a held-out score: "
        "`fusion-plan cost adapt-study` measures that)\n"
        f"saved {new.model_id} to {out} (+ .npz); use it with --cost-model {out}"
    )
    return 0


def run_adapt_study(args: argparse.Namespace) -> int:
    from learned_cost.study.adapt_curve import CurveConfig, reference_mape, render_curve, run_curve

    source, meta = load_model(args.model)
    spec = hardware.get_spec(args.device)
    try:
        sizes = tuple(int(s) for s in args.sizes.split(","))
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        raise CostModelError(
            f"--sizes and --seeds take integers like 0,50,200; got {args.sizes!r}, {args.seeds!r}"
        ) from None
    rows, profiles = _target_rows(args)
    cfg = CurveConfig(
        sizes=sizes,
        seeds=seeds,
        n_splits=args.folds,
        sample=args.sample,
        adapt_steps=args.steps,
        adapt_lr=args.lr,
        scratch_params={"steps": args.scratch_steps, "n_members": args.scratch_members},
        gbt_params={"n_estimators": args.gbt_trees} if args.gbt_trees else {},
    )
    name = f"{meta.device}_to_{spec.name}.json"
    out = Path(args.out or cache_dir() / "studies" / "adapt" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    extra = ["--sizes", args.sizes, "--seeds", args.seeds, "--folds", str(args.folds)]
    extra += ["--sample", args.sample, "--scratch-steps", str(args.scratch_steps)]
    extra += ["--scratch-members", str(args.scratch_members)]
    if args.gbt_trees:
        extra += ["--gbt-trees", str(args.gbt_trees)]
    command = _adapt_command(args, "adapt-study", out, extra)
    ref_path = STUDIES_DIR / f"{meta.device}.json"
    ref_name = _committed(meta.metrics)
    reference = {
        "model": ref_name,
        "study": str(ref_path.relative_to(COMMITTED_DIR.parent.parent)),
        "mape": reference_mape(read_study(ref_path), ref_name) if ref_path.is_file() else {},
    }
    where = {
        "command": command,
        "data_files": list(profiles.sources),
        "data_hash": profiles.data_hash,
        "recaptured": not args.stored_descriptors,
        "reference": reference,
    }

    def write(record: dict) -> None:  # after every fold seed: a cut-short run keeps them
        out.write_text(json.dumps({**record, **where}, indent=1, default=float) + "\n")

    study = run_curve(source, meta, rows, spec, cfg, on_progress=write)
    write(study)
    print(render_curve({**study, **where}))
    print(f"\nwrote {out}")
    return 0


def run_score(args: argparse.Namespace) -> int:
    from learned_cost.study.external import render_external, score_external

    record = score_external(
        args.model, args.data, args.device, recapture=not args.stored_descriptors
    )
    parts = ["fusion-plan", "cost", "score", "--model", args.model]
    for d in args.data:
        parts += ["--data", d]
    parts += ["--device", args.device]
    if args.stored_descriptors:
        parts.append("--stored-descriptors")
    if args.out:
        parts += ["--out", args.out]
    record["command"] = shlex.join(parts)
    print(render_external(record))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1, default=float) + "\n")
        print(f"wrote {out}")
    return 0


# ---- docs ------------------------------------------------------------------------------------
def render_report(
    metas: list[tuple[str, ModelMeta]],
    studies: list[tuple[str, dict]] | None = None,
    root: str | Path = ".",
    adapt_studies: list[tuple[str, dict]] | None = None,
    external: list[tuple[str, dict]] | None = None,
    hw_studies: list[tuple[str, dict]] | None = None,
) -> str:
    """docs/learned_cost.md: the held-out studies (`cost heldout`) first, then every saved
    model's own held-out tables, plus the feature schema. A model's plot is shown only
    where it was drawn from saved points whose figures are the model's tables' (paths
    relative to `root`)."""
    lines = [
        "# Learned cost model: held-out results",
        "",
        "Generated by `fusion-plan cost report --out docs/learned_cost.md` from the metadata of "
        "the saved models; "
        "do not edit by hand. Each model was trained by the command shown; the tables are "
        "grouped cross-validation (never split by row): every row is predicted by models "
        "that did not see its model family (or graph). Plan rows are scored with the group "
        "models of the fold that held their graph out: predicted plan = the plan's corrected "
        "group costs, calibrated to plan context (scale, per-group and per-plan terms and "
        "a per-group factor on the group's features and its graph's footprint against the "
        "L2, fitted on the other folds' plans: "
        "learned_cost/plan_context.py; analytical and mean-bias, which learn nothing from "
        "features, keep scale and intercepts only); `plan error (plain sum)` "
        "is the uncalibrated sum. Regret = measured latency of the plan the model ranks first "
        "over the best measured candidate of that graph, minus 1 (mean over graphs with 2+ "
        "measured plans). Rows timed while the machine was disturbed (median > 1.5x min) are "
        "left out. Groups are timed alone (on GPU since collector version 3, groups and "
        "plans alike as copies of their kernels in one CUDA graph: data/README.md); "
        "`tau (within graph)` is the mean Kendall tau over the groups of one graph, which "
        "the pooled tau flatters less. A model's predicted-vs-measured plot (held out by "
        "its first split) is drawn from the points saved beside it (`NAME.points.json`) and shown "
        "only where its panels' figures are the table's (learned_cost/study/plots.py).",
        "",
        "Measured elsewhere, by commands in the repo: how far a plan is from the sum of its "
        "groups timed alone, the floor under any additive plan error "
        "(`benchmarks/plan_additivity.py`, docs/design_notes.md), and whether the plans a held-out "
        "model chooses run faster than the analytical model's "
        "(`benchmarks/heldout_plans.py`, benchmarks/results/heldout_plans_h100.md).",
        "",
        "Models compared: " + "; ".join(f"**{n}**: {why}" for n, _, why in MODELS) + ".",
        "",
    ]
    if studies:
        lines += [
            "# Held out by architecture and by graph group (`fusion-plan cost heldout`)",
            "",
            "The evaluation the targets are judged by (learned_cost/study/heldout.py): families "
            "grouped by the model class their spec builds, graphs grouped with their dtype and "
            "realization siblings, folds dealt by a seeded shuffle and repeated over several "
            "fold seeds, the MLP form chosen by a nested CV that never sees the outer fold, "
            "every model without and with twins. The per-model sections after these (the "
            "evaluation `cost train` runs: GroupKFold over the family name and the graph key, "
            "one fixed set of folds, form chosen on them) are kept for comparison.",
            "",
        ]
        for path, study in studies:
            committed = next(
                (_committed(m.metrics) for _, m in metas if m.device == study.get("device")),
                None,
            )
            lines += [render_study(study, committed), f"(study file: `{path}`)", ""]
    if adapt_studies:
        from learned_cost.study.adapt_curve import render_curve

        lines += [
            "# Another device from a few of its rows (`fusion-plan cost adapt-study`)",
            "",
            "How a model trained on one device does on another as it is adapted with more "
            "rows measured there (learned_cost/adapt.py), against models trained on those "
            "rows alone; test rows always come from graphs the adaptation rows did not "
            "(learned_cost/study/adapt_curve.py).",
            "",
        ]
        for path, study in adapt_studies:
            lines += [render_curve(study), f"(study file: `{path}`)", ""]
    if external:
        from learned_cost.study.external import render_external

        lines += [
            "# Saved models on data they were not trained on (`fusion-plan cost score`)",
            "",
            "Every row is held out by construction: the committed model, trained on all of "
            "its dataset, predicts rows of graphs that dataset does not hold "
            "(learned_cost/study/external.py).",
            "",
        ]
        for path, rec in external:
            lines += [render_external(rec), f"(score file: `{path}`)", ""]
    if hw_studies:
        from learned_cost.study.hw_features import render as render_hw

        lines += [
            "# Hardware-level features (learned_cost/study/hw_features.py)",
            "",
            "Per-kernel traffic and its share of the L2, launch count, GEMM tile fill along M "
            "and K, wave count and wave fill over the device's SMs, tile-padded over useful "
            "work: appended to the model's features (`-hw`) and fitted on the held-out "
            "study's architecture folds, seed for seed; mean ± sd over the fold seeds.",
            "",
        ]
        for path, rec in hw_studies:
            lines += [
                f"- made by: `{rec.get('command')}` ({rec.get('n_rows')} group rows; MLP "
                f"settings {rec.get('mlp_params') or 'none: gbt only'})",
                "",
                render_hw(rec),
                "",
                f"(study file: `{path}`)",
                "",
            ]
    if studies or adapt_studies or external or hw_studies:
        lines += ["# The saved models and the evaluation they were trained with", ""]
    for path, m in metas:
        met = m.metrics
        if "adaptation" in met:
            lines += _adapted_section(path, m)
            continue
        noisy = met.get("n_noisy_dropped", {})
        lines += [
            f"## {m.device} ({m.model_id})",
            "",
            f"- trained by: `{m.command}`",
            f"- data: {', '.join(m.data_files)} (hash {m.data_hash}, {m.n_rows} group rows, "
            f"{met.get('n_plan_rows', 0)} plan rows used; dropped as disturbed while timed, "
            f"median > {noisy.get('max_noise', '?')}x min: {noisy.get('group', 0)} group, "
            f"{noisy.get('plan', 0)} plan rows); families: {', '.join(met.get('families', []))}",
            f"- torch {m.torch_version}; device figures: "
            f"{'measured (device-bench)' if m.spec_figures.get('measured') else 'datasheet'}; "
            f"saved at `{path}`",
            f"- MLP form chosen: **{met.get('chosen_form')}** (lower held-out MAPE averaged over "
            "the splits; the choice uses those folds, so its numbers are slightly optimistic); "
            f"saved as **{_committed(met)}**",
            f"- in-sample fit of the final model (all rows, for reference only): MAPE "
            f"{100 * met.get('in_sample_final_fit', {}).get('mape', float('nan')):.1f}%",
            "",
        ]
        for split, rec in met.get("splits", {}).items():
            lines += [
                f"### held out by {split}: {rec.get('label', SPLIT_LABELS.get(split, split))}",
                "",
                rec.get("table", ""),
                "",
                _leaders(rec.get("scores", [])),
                "",
                f"Targets for {_committed(met)}: "
                + "; ".join(f"{k}: {v}" for k, v in rec.get("verdicts", {}).items()),
                "",
            ]
            if rec.get("held_out"):
                folds = ", ".join("{" + ", ".join(h) + "}" for h in rec["held_out"])
                lines += [f"Folds (families held out together): {folds}", ""]
        lines += _repeatability(met.get("repeatability"))
        if met.get("plot"):
            lines += _plot(m.device, met["plot"], Path(root))
    lines += [
        f"## Features (schema {SCHEMA_HASH})",
        "",
        "| feature | why |",
        "|---|---|",
        *(f"| {name} | {why} |" for name, _, why in FEATURES),
        "",
    ]
    return "\n".join(lines)


def _adapted_section(path: str, m: ModelMeta) -> list[str]:
    """A model made by `cost adapt`: where from, with what; its held-out figures are the
    adaptation study's."""
    a, src = m.metrics["adaptation"], m.metrics.get("adapted_from", {})
    return [
        f"## {m.device} ({m.model_id}), adapted from {src.get('device')} ({src.get('model_id')})",
        "",
        f"- made by: `{m.command}`",
        f"- data: {', '.join(m.data_files)} (hash {m.data_hash}, {a.get('n_rows')} group rows "
        f"of {a.get('n_graphs')} graphs); method {a.get('method')}, {a.get('steps')} steps, "
        f"lr {a.get('lr')}, twins {a.get('twins')}; log-bias {a.get('bias', 0.0):+.3f}; saved "
        f"at `{path}`",
        f"- in-sample MAPE on those rows (a fit, not a held-out score): source model "
        f"{100 * a.get('in_sample_mape_source', float('nan')):.1f}%, adapted "
        f"{100 * a.get('in_sample_mape_adapted', float('nan')):.1f}%; held-out figures: the "
        "adaptation study above",
        "",
    ]


def _plot(device: str, plot: str, root: Path) -> list[str]:
    """The plot's image line, or why it is left out."""
    from learned_cost.study.plots import problems

    found = problems(plot, root)
    if found:
        return [
            f"The predicted-vs-measured plot is not shown: {'; '.join(found)}. Training again "
            "with the command above saves its points and draws it from them.",
            "",
        ]
    rel = Path(plot).relative_to("docs") if plot.startswith("docs/") else plot
    return [f"![predicted vs measured, {device}]({rel})", ""]


def _committed(met: dict) -> str:
    """The saved model's name in the tables (models saved before twins: the bare form)."""
    return met.get("committed_model") or f"mlp-{met.get('chosen_form')}"


def _repeatability(rep: dict | None) -> list[str]:
    """The data's noise floor next to the model on the same rows (learned_cost.study.evaluate)."""
    if not rep or not rep.get("twin_median"):
        return []

    def row(name: str, g: dict) -> str:
        return (
            f"| {name} | {g['n']} | {100 * g['mape']:.1f}% | {100 * g['median_ape']:.1f}% | "
            f"{g['kendall_tau']:.3f} | {g['kendall_tau_within']:.3f} |"
        )

    return [
        "### noise floor: identical groups measured more than once",
        "",
        f"{rep['n_rows']} group rows fall into {rep['n_sets']} sets of identical groups "
        "(same descriptor, dtype, realization and device) measured in different graphs or "
        "plans. Each row predicted by the median of its twins (leave-one-out) is roughly "
        "the best any model that sees only the group can do; the chosen model, held out, on "
        "the same rows:",
        "",
        "| predictor | rows | MAPE | median APE | tau (all) | tau (within graph) |",
        "|---|---|---|---|---|---|",
        row("twins' median", rep["twin_median"]),
        *(
            row(f"model, held out by {split}", g)
            for split, g in rep.get("held_out_model_on_same_rows", {}).items()
        ),
        "",
    ]


def _leaders(scores: list[dict]) -> str:
    """One line: the best model on each headline metric (computed, not written by hand)."""

    def best(metric: str, key, higher: bool = False) -> str:
        vals = [(key(s), s["name"]) for s in scores if key(s) is not None and key(s) == key(s)]
        if not vals:
            return f"{metric}: no data"
        v, name = max(vals) if higher else min(vals)
        return f"{metric}: {name} ({v:.3f})"

    plans = [s for s in scores if s.get("plans")]
    parts = [
        best("lowest MAPE", lambda s: s["groups"]["mape"]),
        best("highest tau within graph", lambda s: s["groups"]["kendall_tau_within"], True),
    ]
    if plans:
        parts += [
            best("lowest plan error", lambda s: (s.get("plans") or {}).get("plan_mape")),
            best("lowest mean regret", lambda s: (s.get("plans") or {}).get("mean_regret")),
        ]
    return "Best: " + "; ".join(parts) + "."


def committed_adapt_studies(root: Path) -> list[tuple[str, dict]]:
    """The adaptation studies under learned_cost/studies/adapt/, named relative to `root`."""
    return [
        (str(p.relative_to(root)), json.loads(p.read_text()))
        for p in sorted((STUDIES_DIR / "adapt").glob("*.json"))
    ]


def committed_hw_studies(root: Path) -> list[tuple[str, dict]]:
    """The hardware-feature studies in benchmarks/results/, named relative to `root`."""
    return [
        (str(p.relative_to(root)), json.loads(p.read_text()))
        for p in sorted((root / "benchmarks" / "results").glob("*_hw_features.json"))
    ]


def committed_external(root: Path) -> list[tuple[str, dict]]:
    """The `cost score` records under learned_cost/studies/external/, relative to `root`."""
    from learned_cost.study.external import read_external

    return [
        (str(p.relative_to(root)), read_external(p))
        for p in sorted((STUDIES_DIR / "external").glob("*.json"))
    ]


def run_report(args: argparse.Namespace) -> int:
    root = COMMITTED_DIR.parent.parent
    if args.models:
        metas = [(p, read_meta(p)) for p in args.models]
    else:  # cited by the repo-relative path, wherever the command runs from
        metas = [
            (str(p.relative_to(root)), read_meta(p)) for p in sorted(COMMITTED_DIR.glob("*.json"))
        ]
    if args.studies is not None:
        studies = [(p, read_study(p)) for p in args.studies]
    else:
        studies = [
            (str(p.relative_to(root)), read_study(str(p)))
            for p in sorted(STUDIES_DIR.glob("*.json"))
        ]
    if args.adapt_studies is not None:
        adapt = [(p, json.loads(Path(p).read_text())) for p in args.adapt_studies]
    else:
        adapt = committed_adapt_studies(root)
    if args.external is not None:
        from learned_cost.study.external import read_external

        external = [(p, read_external(p)) for p in args.external]
    else:
        external = committed_external(root)
    text = render_report(
        metas,
        studies,
        adapt_studies=adapt,
        external=external,
        hw_studies=committed_hw_studies(root),
    )
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(
        f"wrote {out} ({len(metas)} model(s), {len(studies)} held-out stud(ies))", file=sys.stderr
    )
    return 0
