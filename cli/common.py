"""Helpers every `fusion-plan` subcommand shares when it runs (model, device, dtype, output);
the options themselves are in cli/options.py."""

from __future__ import annotations

import argparse
import json
import os
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


def busy_cpu() -> tuple[float, int] | None:
    """(1-minute load average, cores) when other work already keeps at least half the
    host's cores busy, else None (also where the OS does not report a load); why half:
    docs/measuring.md."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = os.cpu_count() or 1
    return (load, cores) if load >= max(1.0, cores / 2) else None


def apply_threads(args: argparse.Namespace, times_on_cpu: bool = False) -> None:
    """--threads when given. Without it, a command that times on the CPU of a busy host
    (`busy_cpu`) times with one intra-op thread and says so: several threads each
    waiting for a busy core stretch a call to tens of milliseconds at random, which
    turns every speed-up into noise; one thread is steadier."""
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
        return
    busy = busy_cpu() if times_on_cpu else None
    if busy is not None and torch.get_num_threads() > 1:
        torch.set_num_threads(1)
        print(
            f"note: this machine is busy (load {busy[0]:.1f} on {busy[1]} cores): timing with "
            "1 CPU thread, which is steadier here; --threads N sets the count",
            file=sys.stderr,
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


def capture_for_planning(r: Resolved, built: tuple[Any, Any] | None = None) -> Captured:
    """Capture for planning: the backend's graph (`capture_for_serving`), traced without
    data (fake tensors) as the device `tune` and the runtime capture on, so the graph and
    its structure key are theirs.

    The model is built on the CPU (where factories make it in any case) rather than moved
    to the meta device: `.to("meta")` gives tied weights (an LM head sharing the embedding)
    separate parameters, which changes the graph, and dynamo cannot trace a model whose
    KV cache starts from a tensor made on the meta device. `built`: the (module, inputs)
    the spec built that way, when the caller needs the same tensors."""
    module, inputs = built or r.spec.build(dtype=r.dtype, device="cpu")
    return capture_for_serving(module, inputs, name=r.spec.label, trace_as=trace_device())


def emit(args: argparse.Namespace, payload: dict[str, Any], table: str) -> None:
    if args.format == "json":
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(table)
