"""`rl` and `rl-ft`: the trained fusion policy (search/rl_policy.py), zero-shot or tuned.

`rl` plans with the shipped policy (search/policies/fusion_policy.npz + .json) by greedy
decode: deterministic, one episode, no training on the graph: the zero-shot planner for
graphs it never saw. `rl-ft` starts from the same policy and fine-tunes it on the graph
by REINFORCE within the budget (search/rl_train.py `finetune`), returning the best plan of
any episode, the greedy decode included, so it is never worse than `rl`.

Both honour legality by construction: the policy chooses only among legal merges (illegal
ones are masked), and the plan is legal after every step, so a budget that runs out
mid-episode still returns a legal plan.
"""

from __future__ import annotations

from pathlib import Path

from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.rl_policy import DEFAULT_POLICY, Policy, load_policy, rollout
from search.rl_train import finetune
from search.strategy import Clock, Strategy, register

_LOADED: dict[tuple[str, float], Policy] = {}


def cached_policy(path: str | Path = DEFAULT_POLICY) -> Policy:
    """load_policy, once per file version (strategies are created per plan call)."""
    npz = Path(path).with_suffix(".npz")
    key = (str(npz), npz.stat().st_mtime if npz.exists() else 0.0)
    got = _LOADED.get(key)
    if got is None:
        got = _LOADED[key] = load_policy(path)
    return got


@register
class RLStrategy(Strategy):
    name = "rl"
    deterministic = True

    def __init__(self, policy: str | Path = DEFAULT_POLICY):
        self.policy_path = policy

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        policy = cached_policy(self.policy_path)
        ep = rollout(graph, objective, policy.net, greedy=True, clock=clock)
        notes = "policy greedy decode (zero-shot)"
        if not ep.complete:
            notes += "; budget ran out mid-episode: partial plan"
        return ep.partition, ep.complete, notes


@register
class RLFinetuneStrategy(Strategy):
    name = "rl-ft"
    deterministic = False

    def __init__(
        self,
        policy: str | Path = DEFAULT_POLICY,
        *,
        rollouts: int = 4,
        max_iters: int = 10,
        patience: int = 3,
        lr: float = 3e-4,
    ):
        self.policy_path = policy
        self.rollouts, self.max_iters, self.patience, self.lr = rollouts, max_iters, patience, lr

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        policy = cached_policy(self.policy_path)
        out = finetune(
            policy,
            graph,
            objective,
            clock,
            seed,
            rollouts=self.rollouts,
            max_iters=self.max_iters,
            patience=self.patience,
            lr=self.lr,
        )
        gain = 1 - out.total_s / out.zero_shot_s if out.zero_shot_s > 0 else 0.0
        notes = (
            f"fine-tuned {out.iterations} iterations, {out.episodes} episodes; "
            f"{100 * gain:.2f}% below the zero-shot plan"
        )
        if not out.complete:
            notes += "; budget ran out"
        return out.partition, out.complete, notes
