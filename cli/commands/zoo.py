"""`fusion-plan zoo`: the built-in models, their shape parameters and which are dynamic."""

from __future__ import annotations

import argparse

import zoo
from cli.common import emit


def run(args: argparse.Namespace) -> int:
    models = [
        {
            "model": f"zoo:{m.name}",
            "description": m.description,
            "defaults": dict(m.defaults),
            "dynamic": {k: list(v) for k, v in m.dims.items()},
        }
        for m in zoo.ZOO.values()
    ]
    width = max(len(m["model"]) for m in models)
    lines = [f"{'model':<{width}}  {'shape parameters (defaults)':<36}  dynamic  description"]
    for m in models:
        shape = ",".join(f"{k}={v}" for k, v in m["defaults"].items())
        dyn = ",".join(m["dynamic"]) or "-"
        lines.append(f"{m['model']:<{width}}  {shape:<36}  {dyn:<7}  {m['description']}")
    emit(args, {"models": models}, "\n".join(lines))
    return 0
