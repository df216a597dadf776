"""The parser of `fusion-plan tune`, built without torch; the command itself,
cli/commands/tune.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import (
    add_device_arg,
    add_dtype_arg,
    add_format_arg,
    add_storage_arg,
    add_threads_arg,
    positive_float,
    positive_int,
)
from cli.parsers import command
from search.flags import STRATEGY_NAMES, add_cost_model_arg


def bucket_policy(text: str) -> str:
    """argparse type: the bucket policies `tune` can enumerate before it has seen any
    traffic: pow2, or edges:a,b,c. Learned policies (kmeans:k, quantile:k) need a
    histogram of observed shapes, which `tune` does not take: refused here."""
    name, _, arg = text.partition(":")
    if name == "pow2" and not arg:
        return text
    if name == "edges":
        try:
            edges = [int(x) for x in arg.split(",") if x.strip()]
        except ValueError:
            edges = []
        if edges and min(edges) >= 1:
            return text
        raise argparse.ArgumentTypeError(f"bad edges {arg!r}: expected e.g. edges:128,512,2048")
    raise argparse.ArgumentTypeError(
        f"unknown bucket policy {text!r}: use pow2 or edges:a,b,c (buckets learned from "
        "observed shapes are not available to tune)"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="search, realize and measure plans per shape bucket; cache them"
    )
    p.add_argument(
        "--model",
        default="zoo:transformer-block",
        help="zoo:<name> (see `fusion-plan zoo`) or file.py:fn",
    )
    p.add_argument("--shape", default="", help="fixed shape parameters, e.g. B=8,D=768,H=12")
    p.add_argument("--dynamic", default="S=128..1024", help="dynamic dims, e.g. S=128..4096")
    p.add_argument(
        "--buckets",
        type=bucket_policy,
        default="pow2",
        help="bucket policy: pow2 (powers of two) or edges:a,b,c (explicit upper edges)",
    )
    p.add_argument(
        "--strategy",
        default="joint-tpe",
        choices=sorted(STRATEGY_NAMES),
        help="search strategy (joint-tpe: partition and per-group realization together; "
        "tpe: the contested merges only, needed for --storage/--workers)",
    )
    p.add_argument("--budget-evals", type=positive_int, default=None, help="objective evaluations")
    p.add_argument(
        "--budget-seconds", type=positive_float, default=30.0, help="search seconds per bucket"
    )
    p.add_argument(
        "--trials",
        type=positive_int,
        default=None,
        help="trials: Optuna (tpe, nsga2, joint-tpe, joint-nsga2) or samples (joint-rl)",
    )
    p.add_argument("--top-k", type=positive_int, default=3, help="candidates realized and measured")
    add_device_arg(p, measures=True)
    add_dtype_arg(p)
    add_threads_arg(p)
    p.add_argument(
        "--cache",
        default=None,
        help="plan cache: a path, sqlite:///path or a database URL "
        "(default: plans.sqlite in the user's cache directory)",
    )
    add_storage_arg(p)
    p.add_argument(
        "--heartbeat",
        type=positive_int,
        default=None,
        metavar="SECONDS",
        help="database storages: trial heartbeat interval; a worker silent for 3 intervals "
        "has its trial failed and retried (default: 60)",
    )
    p.add_argument(
        "--workers", type=positive_int, default=1, help="local worker processes per study"
    )
    add_cost_model_arg(p)
    p.add_argument(
        "--cost-model-out", default=None, help="save the online-updated learned model here"
    )
    p.add_argument(
        "--from-queue", action="store_true", help="only the buckets the runtime queued as misses"
    )
    p.add_argument(
        "--no-compile-baseline", action="store_true", help="skip timing torch.compile per bucket"
    )
    p.add_argument(
        "--keep-fused",
        action="store_true",
        help="store the fastest candidate even when eager measured faster than every one "
        "(by default the unfused plan is stored then: the backend runs the model's own graph)",
    )
    p.add_argument(
        "--autotune",
        action="store_true",
        help="also measure the fastest candidate with its GEMM and convolution groups "
        "compiled by Inductor's max-autotune (Triton templates benchmarked against the "
        "library call, the epilogue fused into the winner); the faster one is stored. Each "
        "bucket then takes an autotuning compile (tens of seconds on a GPU)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dist-backend",
        choices=("gloo", "nccl"),
        default=None,
        help="run as one rank of a job torchrun started (every rank the same command, each "
        "with its own --cache): the model's collectives run on the ranks, and a "
        "tensor-parallel decision is measured there instead of recorded from its prediction",
    )
    add_format_arg(p)
    p.add_argument(
        "--report",
        default=None,
        metavar="FILE.html",
        help="also write an HTML report: timings per bucket, a roofline, each plan drawn "
        "(needs Graphviz's dot)",
    )
    p.set_defaults(run=command("tune"))
