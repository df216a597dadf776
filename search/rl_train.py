"""Training the RL policy across a corpus, evaluating it, and fine-tuning it on one graph.

Corpus: random DAGs (zoo.randgraph, 8 to 128 ops, seeds below HELD_OUT_SEED) and the
zoo families in TRAIN_ZOO at a few shapes each. Held out, never trained on: the zoo
families in HELD_OUT_ZOO and every random DAG with seed >= HELD_OUT_SEED (the benchmark's).

The network's logits are a fixed prior (priority's gain ordering, tempered; see
rl_policy.PolicyNet) plus an MLP that starts at zero, so training begins from a policy
whose greedy decode is priority and whose samples explore its close calls. REINFORCE on
the analytical H100 model (the cheap inner objective): K sampled episodes per graph,
reward log(unfused / plan cost), the mean of the K rewards as baseline (only beating the
policy's own average counts), an entropy bonus, gradients clipped.

Model selection: a validation set of unseen random DAGs (VALIDATION_SEED onwards) is
scored by greedy decode before training and every `eval_every` iterations; the best
checkpoint is kept (iteration 0 is the prior alone) and the metadata records every score,
so what REINFORCE added, or failed to add, is on record.

`finetune` continues REINFORCE on one graph within a search budget and returns the best
plan any episode found (the greedy decode included): the `rl-ft` strategy.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

import zoo
from learned_cost.analytical import AnalyticalModel
from planner import progress as progress_bars
from planner.fusion.fuse_rules import default_partition
from planner.fusion.partition import Partition
from planner.hardware import get_spec, one_thread
from planner.ir.capture import capture
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.rl_policy import Episode, Policy, PolicyNet, log_probs, rollout
from search.strategy import Clock
from zoo.randgraph import random_graph

log = logging.getLogger("search.rl")

HELD_OUT_SEED = 10_000  # random DAGs with seeds from here on are never trained on
VALIDATION_SEED = 90_000  # model selection uses these; benchmarks use HELD_OUT_SEED onwards
TRAIN_ZOO: dict[str, tuple[dict[str, int], ...]] = {
    "transformer-block": ({}, {"B": 1, "S": 128}, {"B": 4, "S": 2048, "D": 1024, "H": 16}),
    "bert-layer": ({}, {"B": 32, "S": 128}),
    "mlp": ({}, {"B": 8, "L": 4}),
    "pointwise-chain": ({}, {"STEPS": 3}),
    "conv-bn-relu-maxpool": ({}, {"B": 32, "HW": 56}),
    "matmul": ({},),
}
HELD_OUT_ZOO = (
    "gpt2-block",
    "llama-block",
    "resnet-bottleneck",
    "conv-bn-relu-2pool",
    "transformer-block-sdpa",
)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of `train`; the defaults trained the shipped policy."""

    seed: int = 0
    device: str = "h100"
    sizes: tuple[int, ...] = (8, 12, 16, 24, 32, 48, 64, 96, 128)
    seeds_per_size: int = 24
    hidden: int = 64
    prior_scale: float = 20.0
    pattern_prior: float = 2.0
    rl_iters: int = 400
    graphs_per_iter: int = 6
    rollouts: int = 8
    rl_lr: float = 1e-4
    entropy: float = 3e-3
    temperature: float = 1.0
    max_minutes: float = 20.0
    eval_every: int = 20
    val_sizes: tuple[int, ...] = (32, 64, 128, 256)
    val_seeds: int = 6


@dataclass
class TrainReport:
    config: dict[str, Any]
    corpus: dict[str, Any]
    stages: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    selected_iteration: int = 0  # the REINFORCE checkpoint kept (0: the prior alone)


def zoo_graphs(families: dict[str, tuple[dict[str, int], ...]]) -> list[OpGraph]:
    """The zoo models at the given shape overrides, captured on the meta device (bf16)."""
    out = []
    for name, shapes in families.items():
        for params in shapes:
            module, inputs = zoo.get(name).build(
                params or None, dtype=torch.bfloat16, device="meta"
            )
            label = name + (
                "" if not params else ":" + ",".join(f"{k}={v}" for k, v in params.items())
            )
            out.append(capture(module, inputs, name=label))
    return out


def training_corpus(cfg: TrainConfig) -> list[OpGraph]:
    graphs = [random_graph(n, s) for n in cfg.sizes for s in range(cfg.seeds_per_size)]
    return graphs + zoo_graphs(TRAIN_ZOO)


def validation_set(cfg: TrainConfig) -> list[OpGraph]:
    """Random DAGs for model selection: seeds from VALIDATION_SEED, above every training
    seed and apart from the benchmark's (HELD_OUT_SEED onwards); no zoo graph, so the
    held-out zoo families stay unseen by training and by selection alike."""
    return [
        random_graph(n, VALIDATION_SEED + s) for n in cfg.val_sizes for s in range(cfg.val_seeds)
    ]


class _Objectives:
    """One Objective and score memo per graph (costs are cached across episodes)."""

    def __init__(self, device: str):
        spec = get_spec(device, measured=False)
        self.model = AnalyticalModel(spec)
        self.spec = spec
        self.by_key: dict[str, tuple[Objective, dict[int, float], float]] = {}

    def get(self, g: OpGraph) -> tuple[Objective, dict[int, float], float]:
        got = self.by_key.get(g.key)
        if got is None:
            obj = Objective(self.model, spec=self.spec)
            got = (obj, {}, obj.unfused(g).total_s)
            self.by_key[g.key] = got
        return got


def evaluate(net: PolicyNet, graphs: list[OpGraph], objs: _Objectives) -> dict[str, float]:
    """Greedy-decode cost relative to priority (teacher) and to greedy rules, averaged."""
    rel_prio, rel_greedy, wins, losses = [], [], 0, 0
    for g in graphs:
        obj, memo, _ = objs.get(g)
        mine = rollout(g, obj, net, greedy=True, memo=memo).total_s
        prio = rollout(g, obj, net, greedy=True, memo=memo, teacher=True).total_s
        rules = obj.evaluate(default_partition(g, obj.limits)).total_s
        rel_prio.append(mine / prio)
        rel_greedy.append(mine / rules)
        wins += mine < prio * (1 - 1e-9)
        losses += mine > prio * (1 + 1e-9)
    n = max(1, len(graphs))
    return {
        "mean_cost_vs_priority": sum(rel_prio) / n,
        "worst_cost_vs_priority": max(rel_prio, default=math.nan),
        "mean_cost_vs_greedy": sum(rel_greedy) / n,
        "worst_cost_vs_greedy": max(rel_greedy, default=math.nan),
        "better_than_priority": wins,
        "worse_than_priority": losses,
        "graphs": len(graphs),
    }


def reinforce_step(
    net: PolicyNet,
    opt: torch.optim.Optimizer,
    groups: list[list[tuple[Episode, float]]],
    entropy: float,
    temperature: float,
) -> float:
    """One policy-gradient step over groups of (episode, reward) sampled on one graph each;
    the group mean is each episode's baseline. Returns the mean advantage magnitude."""
    advs: list[tuple[Episode, float]] = []
    for eps in groups:
        mean = sum(r for _, r in eps) / len(eps)
        advs.extend((ep, r - mean) for ep, r in eps)
    scale = math.sqrt(sum(a * a for _, a in advs) / max(1, len(advs))) or 1.0
    loss = torch.zeros(())
    for ep, a in advs:
        logp, ent = log_probs(net, ep, temperature)
        steps = max(1, len(ep.merge_steps) + len(ep.pattern_steps))
        loss = loss - (a / scale) * logp - entropy * ent / steps
    if not loss.requires_grad:
        return 0.0  # no episode had a choice to make (nothing was legal and helped)
    opt.zero_grad()
    (loss / max(1, len(advs))).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return sum(abs(a) for _, a in advs) / max(1, len(advs))


def train(
    cfg: TrainConfig, progress: Callable[[str], None] | None = None
) -> tuple[Policy, TrainReport]:
    """Imitation then REINFORCE across the corpus; see the module docstring."""
    say = progress or log.info
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    corpus = training_corpus(cfg)
    val = validation_set(cfg)
    objs = _Objectives(cfg.device)
    net = PolicyNet(hidden=cfg.hidden, prior_scale=cfg.prior_scale, pattern_prior=cfg.pattern_prior)
    report = TrainReport(
        config=asdict(cfg),
        corpus={
            "random_dags": f"zoo.randgraph sizes {list(cfg.sizes)}, seeds 0..{cfg.seeds_per_size - 1}",
            "zoo": {k: [p or "defaults" for p in v] for k, v in TRAIN_ZOO.items()},
            "held_out_zoo": list(HELD_OUT_ZOO),
            "held_out_random_seeds": f">= {HELD_OUT_SEED} (validation: {VALIDATION_SEED}+)",
            "graphs": len(corpus),
        },
    )
    say(f"corpus: {len(corpus)} graphs, validation: {len(val)} held-out graphs")
    with one_thread(), progress_bars.bar(cfg.rl_iters, "train-policy", unit="iter") as bar:
        metrics = evaluate(net, val, objs)
        report.stages.append({"stage": "prior", "iteration": 0, "validation": metrics})
        say(f"prior alone: {_brief(metrics)}")
        best = (_key(metrics), 0, copy.deepcopy(net.state_dict()))
        opt = torch.optim.Adam(net.parameters(), lr=cfg.rl_lr)
        deadline = t0 + 60 * cfg.max_minutes
        it = 0
        while it < cfg.rl_iters and time.perf_counter() < deadline:
            it += 1
            bar.update()
            groups = []
            for g in rng.sample(corpus, cfg.graphs_per_iter):
                obj, memo, unfused = objs.get(g)
                eps = []
                for _ in range(cfg.rollouts):
                    ep = rollout(
                        g, obj, net, greedy=False, generator=gen, memo=memo, record=True,
                        temperature=cfg.temperature,
                    )  # fmt: skip
                    eps.append((ep, math.log(unfused / ep.total_s)))
                groups.append(eps)
            adv = reinforce_step(net, opt, groups, cfg.entropy, cfg.temperature)
            if it % cfg.eval_every == 0 or it == cfg.rl_iters:
                metrics = evaluate(net, val, objs)
                report.stages.append({"stage": "reinforce", "iteration": it, "validation": metrics})
                say(
                    f"reinforce {it}: |adv| {adv:.4f}, {time.perf_counter() - t0:.0f} s, {_brief(metrics)}"
                )
                if _key(metrics) < best[0]:
                    best = (_key(metrics), it, copy.deepcopy(net.state_dict()))
    net.load_state_dict(best[2])
    report.selected_iteration = best[1]
    report.seconds = time.perf_counter() - t0
    say(f"kept the checkpoint of REINFORCE iteration {best[1]} (0: the prior alone)")
    net.eval()
    return Policy(net, {"report": asdict(report)}), report


def _key(metrics: dict[str, float]) -> tuple[float, float]:
    """Model selection on the validation set: mean cost vs priority, then the worst case."""
    return round(metrics["mean_cost_vs_priority"], 6), metrics["worst_cost_vs_priority"]


def _brief(m: dict[str, float]) -> str:
    return (
        f"mean {m['mean_cost_vs_priority']:.4f}x priority (worst {m['worst_cost_vs_priority']:.4f}x, "
        f"{m['better_than_priority']} better / {m['worse_than_priority']} worse of {m['graphs']}), "
        f"{m['mean_cost_vs_greedy']:.4f}x greedy"
    )


# ---- per-graph fine-tuning -------------------------------------------------------------------
@dataclass(frozen=True)
class FineTuned:
    partition: Partition
    total_s: float
    complete: bool
    iterations: int
    episodes: int
    zero_shot_s: float


def finetune(
    policy: Policy,
    graph: OpGraph,
    objective: Objective,
    clock: Clock | None,
    seed: int,
    *,
    rollouts: int = 4,
    max_iters: int = 10,
    patience: int = 3,
    lr: float = 3e-4,
    temperature: float = 1.0,
    entropy: float = 3e-3,
) -> FineTuned:
    """REINFORCE on `graph` alone, from the trained policy; the best plan of any episode
    (the greedy decode first). Stops at `max_iters`, after `patience` iterations without a
    better plan, or when the clock runs out (an episode cut short is dropped)."""
    net = copy.deepcopy(policy.net)
    gen = torch.Generator().manual_seed(seed)
    memo: dict[int, float] = {}
    first = rollout(graph, objective, net, greedy=True, clock=clock, memo=memo)
    best, zero = first, first.total_s
    if not first.complete:
        return FineTuned(first.partition, first.total_s, False, 0, 1, zero)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    episodes, stale, iters, complete = 1, 0, 0, True
    with one_thread():
        while iters < max_iters:
            iters += 1
            eps = []
            for _ in range(rollouts):
                # rollout checks the clock only when it scores an unseen group: once every
                # group of a small graph is memoized, only this check ends the search
                if clock is not None and clock.exhausted():
                    complete = False
                    break
                ep = rollout(
                    graph, objective, net, greedy=False, generator=gen, temperature=temperature,
                    clock=clock, memo=memo, record=True,
                )  # fmt: skip
                if not ep.complete:
                    complete = False
                    break
                episodes += 1
                # reward log(unfused / cost) up to a constant the baseline removes
                eps.append((ep, -math.log(ep.total_s) if ep.total_s > 0 else 0.0))
            improved = False
            for ep, _ in eps:
                if ep.total_s < best.total_s * (1 - 1e-12):
                    best, improved = ep, True
            if not complete or len(eps) < 2:
                break
            reinforce_step(net, opt, [eps], entropy, temperature)
            stale = 0 if improved else stale + 1
            if stale >= patience:
                break
    return FineTuned(best.partition, best.total_s, complete, iters, episodes, zero)
