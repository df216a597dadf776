"""The parser of `fusion-plan train-policy`, built without torch; the command itself,
cli/commands/train_policy.py, is imported when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import search
from cli.options import positive_float, positive_int
from cli.parsers import command

# `search.rl_policy.DEFAULT_POLICY` and `search.rl_train.TrainConfig.rl_iters`, named here
# without importing them (both import torch).
SHIPPED_POLICY = Path(search.__file__).parent / "policies" / "fusion_policy"
RL_ITERS = 400


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-policy", help="train the RL fusion policy (REINFORCE)")
    p.add_argument(
        "--out",
        default=None,
        help="path without suffix (.npz/.json); the shipped policy is "
        f"{SHIPPED_POLICY}, replaced only when named (default: "
        "<user cache>/policies/fusion_policy)",
    )
    p.add_argument(
        "--minutes", type=positive_float, default=20.0, help="wall-clock cap of REINFORCE"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rl-iters", type=positive_int, default=RL_ITERS)
    p.add_argument("--quick", action="store_true", help="a tiny corpus: minutes, for smoke tests")
    p.set_defaults(run=command("train_policy"))
