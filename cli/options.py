"""The options `fusion-plan` commands share, as argparse types and `add_*` helpers.

Pure Python, like every parser module (cli/parsers/): no torch, Optuna or scikit-learn
is imported to build a parser, so `--help` and a bad value's error are immediate.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from planner import hardware
from planner.distributed.links import known_links
from planner.errors import FusionPlannerError

# The names `zoo.modelspec.DTYPES` parses.
DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")


# ---- argument types: a bad number is refused by the parser, with its flag named ----------
def _number(text: str, kind: type, lo: float, lo_open: bool, hi: float | None = None) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind.__name__} value, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if value < lo or (lo_open and value == lo):
        raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g}, got {text}")
    if hi is not None and value > hi:
        raise argparse.ArgumentTypeError(f"must be <= {hi:g}, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _number(text, int, 1, False)


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _number(text, int, 0, False)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (nan and inf refused)."""
    return _number(text, float, 0.0, True)


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0 (nan and inf refused)."""
    return _number(text, float, 0.0, False)


def days(text: str) -> float:
    """argparse type: an age in days, finite, 0 to 36500."""
    return _number(text, float, 0.0, False, 36500.0)


def device_name(text: str) -> str:
    """argparse type: a known device spec name (h100, a100, cpu, ...), case-insensitive."""
    name = text.strip().lower()
    if name not in hardware.known_devices():
        raise argparse.ArgumentTypeError(
            f"unknown device {text!r}; known: {', '.join(hardware.known_devices())}"
        )
    return name


def dtype_arg(text: str) -> str:
    """argparse type: fp32, bf16 or fp16."""
    name = text.strip().lower()
    if name not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; use fp32, bf16 or fp16")
    return name


def storage_arg(text: str) -> str:
    """argparse type: an Optuna storage in one of the forms search.optuna_storage takes."""
    from search.optuna_storage import storage_kind  # optuna loads with it: only when given

    try:
        storage_kind(text)
    except FusionPlannerError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_device_arg(p: argparse.ArgumentParser, *, measures: bool = False) -> None:
    """--device, the same name and values on every command. Commands that measure run
    on this machine: for them a device other than this machine's is an error."""
    where = (
        "must be this machine's: this command measures here"
        if measures
        else "what-if planning for another device works"
    )
    p.add_argument(
        "--device",
        type=device_name,
        default=None,
        metavar="NAME",
        help=f"device spec, one of {', '.join(hardware.known_devices())} ({where}; "
        "default: this machine's)",
    )


def add_dtype_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        type=dtype_arg,
        default=None,
        help="fp32 | bf16 | fp16 (default: bf16 on GPU, fp32 on CPU)",
    )


def add_format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format", choices=("table", "json"), default="table", help="output for people or programs"
    )


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    """--threads on every command that times: fewer threads are steadier on a busy host."""
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch CPU threads while measuring (1 is steadier on a busy host; "
        "default: torch's, one per core, or 1 when timing on the CPU of a host whose load "
        "keeps half its cores busy)",
    )


def add_storage_arg(p: argparse.ArgumentParser) -> None:
    """--storage, the same syntax on `plan` and `tune`."""
    p.add_argument(
        "--storage",
        type=storage_arg,
        default=None,
        metavar="URL",
        help="Optuna study storage (tpe, nsga2): memory, sqlite[:///path], journal[:path] "
        "(several local workers) or a database URL such as postgresql://... (a fleet) "
        "(default: memory)",
    )


def add_model_args(
    p: argparse.ArgumentParser,
    *,
    default_model: str = "zoo:transformer-block",
    measures: bool = False,
) -> None:
    p.add_argument(
        "--model",
        default=default_model,
        help="zoo:<name> (see `fusion-plan zoo`) or path/to/file.py:factory",
    )
    p.add_argument(
        "--shape",
        default="",
        help="shape parameters, e.g. B=8,S=512,D=768,H=12 (default: the model's)",
    )
    add_device_arg(p, measures=measures)
    add_dtype_arg(p)
    add_format_arg(p)


def add_dist_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("distributed what-if")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel ranks (zoo:tp-* models)")
    g.add_argument("--dp", type=int, default=None, help="data-parallel ranks: adds a train step")
    g.add_argument(
        "--pp", type=int, default=None, help="pipeline stages: prices a step over micro-batches"
    )
    g.add_argument(
        "--microbatches",
        default="auto",
        help="micro-batches the batch (the shape's B) is split into for --pp, or auto: the "
        "divisor of B with the shortest step whose activations fit --activation-limit-mb",
    )
    g.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved"))
    g.add_argument(
        "--virtual-stages",
        type=int,
        default=None,
        help="--schedule interleaved: model chunks per pipeline stage (v; the graph is cut "
        "into v x --pp chunks, chunk c of stage d being chunk c*pp + d); --microbatches "
        "must then be a multiple of --pp",
    )
    g.add_argument(
        "--activation-limit-mb",
        type=float,
        default=None,
        help="--pp: activation memory per stage (MiB) a micro-batch count must fit",
    )
    g.add_argument(
        "--microbatch-overhead-us",
        type=float,
        default=None,
        help="--pp: fixed forward cost of one micro-batch per stage (us; backward: "
        "BACKWARD_FACTOR times it); default: the stage's kernel launches",
    )
    g.add_argument(
        "--interconnect",
        default=None,
        help=f"link: {', '.join(known_links())} (default: nvlink on a GPU spec, else local)",
    )
    g.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="DP gradient bucket (MiB); default: searched (shown beside DDP's 25 MiB)",
    )
    g.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks per node: an all-reduce over more ranks runs hierarchically",
    )
    g.add_argument("--inter-node", default="ib-ndr", help="link between nodes (default ib-ndr)")
    add_step_model_arg(g)
    g.add_argument(
        "--backward",
        default="auto",
        choices=BACKWARD_SOURCES,
        help="the backward pass the --dp training step and its bucket search are priced "
        "with: measured (the model's forward and backward run on this machine, each "
        "gradient's ready time taken from a hook) or estimated (each forward op's "
        "predicted time x2, gradients ready at their last forward reader); default auto: "
        "measured when --device is this machine's and the model runs without a process "
        "group (no collectives), estimated otherwise, since a measurement describes only "
        "the device it ran on",
    )


def add_link_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interconnect",
        default=None,
        help="link pricing the graph's collectives (default: nvlink on a GPU spec, else local)",
    )
    add_step_model_arg(p)


# planner.distributed.dp.STEP_MODELS, spelled out so the parsers need no torch
DP_STEP_MODELS = ("two-stream", "serial")
# where the --dp training step's backward comes from (cli/commands/analyze_dist.py)
BACKWARD_SOURCES = ("auto", "measured", "estimated")


def add_step_model_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--dp-step-model",
        default=None,
        choices=DP_STEP_MODELS,
        help="how the DP step that prices gradient buckets runs its all-reduces: two-stream "
        "(beside the backward, as NCCL on GPUs) or serial (on the backward's cores, as "
        "gloo on CPU ranks); default: chosen from the link's backend, else the device",
    )


def add_search_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trials",
        type=positive_int,
        default=None,
        help="tpe/nsga2: trials (per worker); joint-*: trials or samples",
    )
    add_storage_arg(p)
    p.add_argument(
        "--workers", type=positive_int, default=1, help="local processes sharing the study"
    )
    p.add_argument("--bucket", default="adhoc", help="shape-bucket id: one study per bucket")
