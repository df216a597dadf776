"""Options and helpers every `fusion-plan` subcommand shares (model, shape, device, dtype)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

import torch

from planner import hardware
from planner.errors import FusionPlannerError
from planner.ir.capture import Captured, trace_device
from planner.runtime.graph import capture_for_serving
from zoo import modelspec
from zoo.modelspec import ModelSpec


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
    if name not in modelspec.DTYPES:
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


def check_local_device(args: argparse.Namespace) -> str:
    """This machine's device name; a FusionPlannerError if --device names another."""
    local = hardware.local_device_name()
    if args.device and args.device != local:
        raise FusionPlannerError(
            f"--device {args.device}: this command measures on this machine, which is "
            f"{local}; run it there, or use `plan`/`analyze` for what-if planning"
        )
    return local


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
        "default: torch's, one per core)",
    )


def apply_threads(args: argparse.Namespace) -> None:
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


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


@dataclass(frozen=True)
class Resolved:
    spec: ModelSpec
    device_name: str  # spec name, e.g. "h100" or "cpu"
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        return modelspec.dtype_name(self.dtype)


def resolve(args: argparse.Namespace) -> Resolved:
    spec = modelspec.resolve(args.model, args.shape)
    device = (args.device or hardware.local_device_name()).lower()
    hardware.get_spec(device)  # validates the name early, with a clear message
    if args.dtype:
        dtype = modelspec.parse_dtype(args.dtype)
    else:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    return Resolved(spec, device, dtype)


def capture_for_planning(r: Resolved) -> Captured:
    """Capture for planning: the backend's graph (`capture_for_serving`), traced without
    data (fake tensors) as the device `tune` and the runtime capture on, so the graph and
    its structure key are theirs.

    The model is built on the CPU (where factories make it in any case) rather than moved
    to the meta device: `.to("meta")` gives tied weights (an LM head sharing the embedding)
    separate parameters, which changes the graph, and dynamo cannot trace a model whose
    KV cache starts from a tensor made on the meta device."""
    module, inputs = r.spec.build(dtype=r.dtype, device="cpu")
    return capture_for_serving(module, inputs, name=r.spec.label, trace_as=trace_device())


def emit(args: argparse.Namespace, payload: dict[str, Any], table: str) -> None:
    if args.format == "json":
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(table)
