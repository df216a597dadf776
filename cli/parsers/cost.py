"""The parser of `fusion-plan cost`, built without torch; the command itself,
cli/commands/cost.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import device_name, hardware, positive_int
from cli.parsers import command

# The forms `learned_cost.mlp.FORMS` names (learned_cost imports torch).
MLP_FORMS = ("free", "roofline", "mixed")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cost", help="train, evaluate and document the learned cost correction")
    verbs = p.add_subparsers(dest="verb", required=True)
    for verb, helptext in (
        ("train", "cross-validate all models, fit the MLP on all rows, save it"),
        ("eval", "cross-validate all models side by side (nothing saved)"),
    ):
        v = verbs.add_parser(verb, help=helptext)
        v.add_argument(
            "--data", action="append", required=True, help="dataset-v1 Parquet (repeatable)"
        )
        v.add_argument(
            "--device",
            type=device_name,
            default=None,
            metavar="NAME",
            help=f"device spec of the rows to use: {', '.join(hardware.known_devices())} "
            "(default: this machine's)",
        )
        v.add_argument(
            "--split",
            default="family,graph_key",
            help="grouped CV keys, comma-separated: family (unseen model families), "
            "graph_key (unseen graphs) (default: %(default)s)",
        )
        v.add_argument(
            "--folds", type=positive_int, default=5, help="GroupKFold splits (default 5)"
        )
        v.add_argument("--seed", type=int, default=0)
        v.add_argument("--steps", type=positive_int, default=None, help="MLP gradient steps")
        v.add_argument(
            "--dropout",
            type=_dropout,
            default=None,
            help="MLP dropout in [0, 1) (default 0.3: noisy data wants more)",
        )
        v.add_argument(
            "--hidden",
            type=_hidden,
            default=None,
            help="MLP hidden layer widths, comma-separated (default 64,64)",
        )
        v.add_argument(
            "--form",
            choices=("auto", *MLP_FORMS),
            default="auto",
            help="MLP form (mixed: the mean of a free and a roofline ensemble): auto picks "
            "the lowest held-out MAPE, averaged over the splits",
        )
        v.add_argument(
            "--no-twins",
            action="store_true",
            help="do not answer groups the training rows measured from those measurements "
            "(learned_cost/twins.py); the networks alone predict every group",
        )
        v.add_argument(
            "--plot",
            default=None,
            help="predicted-vs-measured PNG (default: "
            + ("next to the model, OUT with .png)" if verb == "train" else "none)"),
        )
        v.add_argument("--format", choices=("table", "json"), default="table")
        if verb == "train":
            v.add_argument(
                "--out",
                default=None,
                help="model path (.json + .npz); the shipped models are replaced only when "
                "named (default: <user cache>/models/<device>.json)",
            )
        else:
            v.add_argument(
                "--model", default=None, help="a saved model whose MLP hyper-parameters to use"
            )
        v.set_defaults(run=command("cost", "run_train" if verb == "train" else "run_eval"))
    h = verbs.add_parser(
        "heldout",
        help="grouped CV by architecture and by graph group over several fold seeds, MLP form "
        "chosen by nested CV; writes a study JSON the report shows (learned_cost/study/heldout.py)",
    )
    h.add_argument(
        "--data",
        action="append",
        required=True,
        help="dataset-v1 Parquet of --device's rows; several files: comma-separated or "
        "repeated (rows concatenated)",
    )
    h.add_argument("--device", default=None, help="device spec of the rows to use")
    h.add_argument("--split", default="architecture,graph", help="default: %(default)s")
    h.add_argument("--seeds", default="0,1,2", help="fold seeds, comma-separated")
    h.add_argument("--folds", type=positive_int, default=5, help="outer folds (default 5)")
    h.add_argument(
        "--inner-folds", type=positive_int, default=2, help="inner folds choosing the MLP form"
    )
    h.add_argument(
        "--model",
        default=None,
        help="a saved model whose MLP hyper-parameters to use (then --steps etc. override)",
    )
    h.add_argument("--steps", type=positive_int, default=None, help="MLP gradient steps")
    h.add_argument("--members", type=positive_int, default=None, help="MLP ensemble size")
    h.add_argument("--gbt-trees", type=positive_int, default=None, help="gbt n_estimators")
    h.add_argument(
        "--limit-rows",
        type=positive_int,
        default=None,
        help="use every n-th group and plan row only (a quick look; the report says so)",
    )
    h.add_argument(
        "--stored-descriptors",
        action="store_true",
        help="keep the descriptors stored at collection and skip the plan rows (no graph "
        "is recaptured: much faster; no plan error or regret)",
    )
    h.add_argument(
        "--out",
        default=None,
        help="default: studies/<device>.json in the user cache directory (the committed "
        "studies live in learned_cost/studies/)",
    )
    h.set_defaults(run=command("cost", "run_heldout"))
    _add_adapt_parsers(verbs)
    sc = verbs.add_parser(
        "score",
        help="score a saved model on a dataset it was not trained on (an unseen family: the "
        "real-model suite), groups and plans (learned_cost/study/external.py)",
    )
    sc.add_argument("--model", required=True, help="the saved model (.json)")
    sc.add_argument("--data", action="append", required=True, help="dataset-v1 Parquet")
    sc.add_argument(
        "--device", type=device_name, required=True, metavar="NAME", help="the rows' device"
    )
    sc.add_argument(
        "--stored-descriptors",
        action="store_true",
        help="keep the descriptors stored at collection (default: recompute them)",
    )
    sc.add_argument(
        "--out",
        default=None,
        help="score JSON (the committed ones live in learned_cost/studies/external/)",
    )
    sc.set_defaults(run=command("cost", "run_score"))
    r = verbs.add_parser(
        "report", help="the held-out results of saved models as Markdown (docs/learned_cost.md)"
    )
    r.add_argument(
        "--models",
        nargs="*",
        default=None,
        help="saved model JSON files (default: the models shipped with the package)",
    )
    r.add_argument(
        "--out",
        default="-",
        help="Markdown file, or - for stdout; the committed report is rewritten only when "
        "named: --out docs/learned_cost.md",
    )
    r.add_argument(
        "--studies",
        nargs="*",
        default=None,
        help="held-out study JSON files (default: learned_cost/studies/*.json)",
    )
    r.add_argument(
        "--adapt-studies",
        nargs="*",
        default=None,
        help="adaptation study JSON files (default: learned_cost/studies/adapt/*.json)",
    )
    r.add_argument(
        "--external",
        nargs="*",
        default=None,
        help="`cost score` JSON files (default: learned_cost/studies/external/*.json)",
    )
    r.set_defaults(run=command("cost", "run_report"))


# The methods `learned_cost.adapt.METHODS` names.
ADAPT_METHODS = ("none", "bias", "last-layer", "finetune")


def _add_adapt_common(v: argparse.ArgumentParser) -> None:
    v.add_argument(
        "--model",
        required=True,
        help="the saved model to adapt (e.g. learned_cost/models/h100.json), any device's",
    )
    v.add_argument(
        "--data", action="append", required=True, help="the new device's rows (repeatable)"
    )
    v.add_argument(
        "--device",
        type=device_name,
        required=True,
        metavar="NAME",
        help=f"the device the rows were measured on: {', '.join(hardware.known_devices())}",
    )
    v.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="gradient steps of last-layer / finetune (default 300 / 200)",
    )
    v.add_argument(
        "--lr", type=float, default=1e-3, help="their learning rate (default %(default)s)"
    )
    v.add_argument(
        "--stored-descriptors",
        action="store_true",
        help="keep the descriptors stored at collection (default: recompute them on today's "
        "capture of each row's graph, as training does)",
    )


def _add_adapt_parsers(verbs: argparse._SubParsersAction) -> None:
    a = verbs.add_parser(
        "adapt",
        help="adapt a saved model to another device from a few of its rows; saves a model "
        "for that device (learned_cost/adapt.py)",
    )
    _add_adapt_common(a)
    a.add_argument(
        "--method",
        choices=ADAPT_METHODS,
        default="finetune",
        help="bias: one log-bias; last-layer: bias, then the output layers refitted; "
        "finetune: bias, then every weight, warm-started (default)",
    )
    a.add_argument(
        "--rows",
        type=positive_int,
        default=None,
        help="use the first N usable group rows only (in file order)",
    )
    a.add_argument(
        "--no-twins",
        action="store_true",
        help="do not answer groups the new rows measured from those measurements",
    )
    a.add_argument(
        "--out",
        default=None,
        help="model path (.json + .npz) (default: <user cache>/models/<device>.json)",
    )
    a.set_defaults(run=command("cost", "run_adapt"))
    s = verbs.add_parser(
        "adapt-study",
        help="held-out error on the new device against the rows used to adapt, adapted vs "
        "trained from scratch, over fold seeds (learned_cost/study/adapt_curve.py)",
    )
    _add_adapt_common(s)
    s.add_argument("--sizes", default="0,50,200,1000", help="adaptation rows, comma-separated")
    s.add_argument("--seeds", default="0,1,2", help="fold seeds, comma-separated")
    s.add_argument("--folds", type=positive_int, default=4, help="folds by graph group")
    s.add_argument(
        "--sample",
        choices=("graphs", "rows"),
        default="graphs",
        help="take adaptation rows graph by graph (as a short collection does) or any rows",
    )
    s.add_argument(
        "--scratch-steps", type=positive_int, default=2000, help="steps of the scratch MLP"
    )
    s.add_argument(
        "--scratch-members",
        type=positive_int,
        default=1,
        help="ensemble size of the scratch MLP (of each form for mixed)",
    )
    s.add_argument("--gbt-trees", type=positive_int, default=None, help="scratch gbt trees")
    s.add_argument(
        "--out",
        default=None,
        help="study JSON (default: studies/adapt/<from>_to_<to>.json in the user cache; the "
        "committed ones live in learned_cost/studies/adapt/)",
    )
    s.set_defaults(run=command("cost", "run_adapt_study"))


def _dropout(text: str) -> float:
    try:
        p = float(text)
    except ValueError:
        p = -1.0
    if not 0.0 <= p < 1.0:
        raise argparse.ArgumentTypeError(f"--dropout must be a number in [0, 1), got {text!r}")
    return p


def _hidden(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(
            f"--hidden takes positive layer widths like 128,128; got {text!r}"
        )
    return widths
