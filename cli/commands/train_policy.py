"""`fusion-plan train-policy`: train the RL fusion policy across the corpus and save it.

    fusion-plan train-policy --out search/policies/fusion_policy --minutes 20 --seed 0

Writes OUT.npz (state dict) and OUT.json (feature schema, corpus, hyper-parameters, the
validation scores of the prior alone and of every REINFORCE checkpoint, the one kept, and
this command). The shipped policy was trained with exactly the command in its JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from planner import progress
from planner.hardware import cache_dir
from search.rl_policy import save_policy
from search.rl_train import TrainConfig, train


def run(args: argparse.Namespace) -> int:
    cfg = TrainConfig(seed=args.seed, max_minutes=args.minutes, rl_iters=args.rl_iters)
    if args.quick:
        cfg = dataclasses.replace(
            cfg, sizes=(8, 16, 32), seeds_per_size=3, bc_epochs=2, graphs_per_iter=2,
            rollouts=3, val_sizes=(32,), val_seeds=2,
        )  # fmt: skip
    out = args.out or str(cache_dir() / "policies" / "fusion_policy")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    policy, report = train(cfg, progress=progress.say)
    command = "fusion-plan " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    policy.meta["command"] = command
    npz, meta = save_policy(policy, out)
    kept = next(
        s["validation"] for s in report.stages if s.get("iteration") == report.selected_iteration
    )
    print(f"saved {npz} and {meta} ({report.seconds / 60:.1f} min)")
    print(
        f"kept iteration {report.selected_iteration}; validation greedy decode: "
        f"{kept['mean_cost_vs_priority']:.4f}x priority on average (worst "
        f"{kept['worst_cost_vs_priority']:.4f}x, {kept['better_than_priority']} better / "
        f"{kept['worse_than_priority']} worse of {kept['graphs']}), "
        f"{kept['mean_cost_vs_greedy']:.4f}x greedy"
    )
    return 0
