"""Options and helpers every `fusion-plan` subcommand shares (model, shape, device, dtype)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

import torch

from planner import hardware, modelspec
from planner.capture import Captured
from planner.modelspec import ModelSpec
from planner.runtime_graph import capture_for_serving


def add_model_args(
    p: argparse.ArgumentParser,
    *,
    default_model: str = "zoo:transformer-block",
    device_default: str | None = None,
) -> None:
    p.add_argument(
        "--model",
        default=default_model,
        help="zoo:<name> or path/to/file.py:factory (default: %(default)s)",
    )
    p.add_argument("--shape", default="", help="shape parameters, e.g. B=8,S=512,D=768,H=12")
    p.add_argument(
        "--device",
        default=device_default,
        help=f"device spec: {', '.join(hardware.known_devices())} (default: this machine's)",
    )
    p.add_argument(
        "--dtype", default=None, help="fp32 | bf16 | fp16 (default: bf16 on GPU, fp32 on CPU)"
    )
    p.add_argument("--format", choices=("table", "json"), default="table")


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
    """Capture on the meta device: planning needs shapes, not data."""
    module, inputs = r.spec.build(dtype=r.dtype, device="meta")
    return capture_for_serving(module, inputs, name=r.spec.label)


def emit(args: argparse.Namespace, payload: dict[str, Any], table: str) -> None:
    if args.format == "json":
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(table)
