"""Search the joint space (search/joint_space.py) with Optuna (TPE, NSGA-II) or a policy.

Every method walks the same space through `JointSpace.sample(ask)`:

1. the warm start: priority's plan with the rule's labels (`default_ask`), the first point;
2. enumeration: the space is a tree of questions (each answer may open others), walked in
   order until `enumerate_up_to` points; a space that ends within it is searched
   exhaustively and said so ("space exhausted after N plans"), whatever the budget;
3. otherwise the method samples until the budget (evaluations, seconds), `max_trials`, or
   `patience` samples in a row that found no plan not seen before:
   - "tpe": Optuna's multivariate TPE over the conditional parameters (define-by-run);
   - "nsga2": Optuna's NSGA-II on two objectives, modelled latency and the number of
     groups compiled with max-autotune (each costs an autotuning compile);
   - "rl": a REINFORCE policy over the same questions (a softmax per question, a prior
     toward the neutral first answer, the mean reward of a batch as baseline; reward
     log(priority's modelled cost / the point's)). Needs no optuna.

The answer ranks every distinct point by modelled cost (ties: fewer non-default labels),
each with what found it (`found_by`: "priority (warm start)", "enumeration", "tpe trial
17", ...), so the tune loop measures the top-k and the stored plan says who found it.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner import progress as progress_bars
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.joint_space import JointSpace, Variant, default_ask
from search.merge_env import OutOfBudget
from search.optuna_storage import require_optuna
from search.strategy import Clock

METHODS = ("tpe", "nsga2", "rl")
WARM = "priority (warm start)"


@dataclass(frozen=True)
class Found:
    variant: Variant
    predicted_s: float
    found_by: str


@dataclass
class JointOutcome:
    ranked: list[Found] = field(default_factory=list)  # distinct points, best first
    samples: int = 0  # points asked for (repeats included)
    exhausted: bool = False  # every point of the space was seen
    complete: bool = True  # False when the budget stopped the search
    stop: str = ""  # why the search stopped, in words
    decisions: int = 0  # partition decisions (encoding + merge moves)

    @property
    def best(self) -> Found | None:
        return self.ranked[0] if self.ranked else None


class _Book:
    """The distinct points seen, their predictions and who found each first."""

    def __init__(self, space: JointSpace, clock: Clock):
        self.space, self.clock = space, clock
        self.seen: dict[Any, Found] = {}
        self.samples = 0
        self.stale = 0  # samples in a row that found nothing new
        self.last_say = time.perf_counter()

    def add(self, v: Variant, found_by: str) -> float:
        self.samples += 1
        got = self.seen.get(v.key)
        if got is not None:
            self.stale += 1
            return got.predicted_s
        self.stale = 0
        pred, _ = self.space.predict(v)
        self.seen[v.key] = Found(v, pred, found_by)
        return pred

    def ranked(self) -> list[Found]:
        return sorted(
            self.seen.values(),
            key=lambda f: (f.predicted_s, f.variant.non_default(), len(f.variant.partition)),
        )


def _enumerate(space: JointSpace, book: _Book, limit: int) -> bool:
    """Walk the question tree in order, up to `limit` points; True when it ended."""
    path: list[list[int]] = []  # [answer index, number of choices] per question asked

    def ask(name: str, choices: Sequence[Any]) -> Any:
        depth = ask.depth  # type: ignore[attr-defined]
        if depth == len(path):
            path.append([0, len(choices)])
        ask.depth = depth + 1  # type: ignore[attr-defined]
        return choices[path[depth][0]]

    for _ in range(limit):
        if book.clock.exhausted(1):
            return False
        ask.depth = 0  # type: ignore[attr-defined]
        book.add(space.sample(ask), "enumeration" if book.samples else WARM)
        del path[ask.depth :]  # type: ignore[attr-defined]
        while path and path[-1][0] + 1 >= path[-1][1]:
            path.pop()
        if not path:
            return True
        path[-1][0] += 1
    return False


def _stopper(book: _Book, max_trials: int, patience: int, label: str, say: Callable) -> Callable:
    """A check before each sample: the reason to stop, or ""."""

    def why() -> str:
        if book.clock.exhausted(1):
            return "budget spent"
        if book.samples >= max_trials:
            return f"{max_trials} samples"
        if book.stale >= patience:
            return f"no new plan in the last {patience} samples"
        now = time.perf_counter()
        if now - book.last_say >= 5.0:
            book.last_say = now
            say(progress_line(book, label))
        return ""

    return why


def progress_line(book: _Book, label: str) -> str:
    best = min((f.predicted_s for f in book.seen.values()), default=math.inf)
    warm = next((f.predicted_s for f in book.seen.values() if f.found_by == WARM), math.inf)
    rel = f"{100 * (best / warm - 1):+.2f}% vs priority" if math.isfinite(warm) else ""
    return (
        f"{label}: {book.samples} samples, {len(book.seen)} distinct plans, best {rel}, "
        f"{book.clock.seconds:.1f} s"
    )


def _optuna(space: JointSpace, book: _Book, method: str, seed: int, stop: Callable) -> None:
    opt = require_optuna()
    if method == "nsga2":
        sampler = opt.samplers.NSGAIISampler(seed=seed)
        directions = ["minimize", "minimize"]
    else:
        with warnings.catch_warnings():  # `group` is marked experimental; it is what
            warnings.simplefilter("ignore")  # conditional parameters need
            sampler = opt.samplers.TPESampler(multivariate=True, group=True, seed=seed)
        directions = ["minimize"]
    study = opt.create_study(directions=directions, sampler=sampler)
    warm: dict[str, Any] = {}

    def record(name: str, choices: Sequence[Any]) -> Any:
        warm[name] = choices[0]
        return choices[0]

    space.sample(record)
    study.enqueue_trial(warm)
    while not stop():
        trial = study.ask()
        v = space.sample(lambda name, choices, t=trial: t.suggest_categorical(name, list(choices)))
        pred = book.add(v, f"{method} trial {trial.number}")
        value = pred if math.isfinite(pred) else 1e9
        study.tell(trial, [value, float(v.autotuned())] if method == "nsga2" else value)


def _reinforce(space: JointSpace, book: _Book, seed: int, stop: Callable) -> None:
    rng = np.random.default_rng(seed)
    logits: dict[str, np.ndarray] = {}
    prior, lr, batch = 2.0, 0.5, 8
    base = book.add(space.sample(default_ask), WARM) if not book.samples else math.nan
    ref = min((f.predicted_s for f in book.seen.values()), default=base)
    episode = 0
    while not stop():
        taken: list[list[tuple[str, int, np.ndarray]]] = []
        rewards: list[float] = []
        for _ in range(batch):
            if stop():
                break
            steps: list[tuple[str, int, np.ndarray]] = []

            def ask(name: str, choices: Sequence[Any], steps: list = steps) -> Any:
                lg = logits.get(name)
                if lg is None:
                    lg = logits[name] = np.zeros(len(choices))
                    lg[0] = prior
                p = np.exp(lg - lg.max())
                p /= p.sum()
                k = int(rng.choice(len(choices), p=p))
                steps.append((name, k, p))
                return choices[k]

            episode += 1
            pred = book.add(space.sample(ask), f"rl episode {episode}")
            taken.append(steps)
            rewards.append(math.log(ref / pred) if math.isfinite(pred) and ref > 0 else -1.0)
        if not rewards:
            break
        mean = sum(rewards) / len(rewards)
        for steps, r in zip(taken, rewards):
            for name, k, p in steps:
                grad = -p
                grad[k] += 1.0
                logits[name] += lr * (r - mean) * grad


def run_joint(
    graph: OpGraph,
    objective: Objective,
    clock: Clock,
    *,
    method: str = "tpe",
    seed: int = 0,
    max_trials: int = 200,
    patience: int = 60,
    enumerate_up_to: int = 64,
    say: Callable[[str], None] = progress_bars.say,
) -> JointOutcome:
    """Search the joint space of `graph` (see the module doc)."""
    if method not in METHODS:
        raise ValueError(f"unknown joint search method {method!r}; expected one of {METHODS}")
    out = JointOutcome()
    try:
        space = JointSpace(graph, objective, clock)
    except OutOfBudget:
        out.complete, out.stop = False, "budget ran out building the space"
        return out
    out.decisions = space.n_partition_decisions
    book = _Book(space, clock)
    label = f"joint-{method}"
    try:
        if _enumerate(space, book, max(1, min(enumerate_up_to, max_trials))):
            out.exhausted = True
            out.stop = f"space exhausted after {len(book.seen)} plans (every point enumerated)"
        else:
            stop = _stopper(book, max_trials, patience, label, say)
            if method == "rl":
                _reinforce(space, book, seed, stop)
            else:
                _optuna(space, book, method, seed, stop)
            out.stop = stop() or "stopped"
            out.complete = out.stop != "budget spent"
    except OutOfBudget:
        out.complete, out.stop = False, "budget spent"
    out.ranked, out.samples = book.ranked(), book.samples
    return out


def describe(out: JointOutcome) -> str:
    """One line: what was searched, why it stopped, what won and who found it."""
    best = out.best
    if best is None:
        return f"no plan ({out.stop})"
    warm = next((f for f in out.ranked if f.found_by == WARM), None)
    gain = ""
    if warm is not None and math.isfinite(warm.predicted_s) and warm.predicted_s > 0:
        gain = f", {100 * (best.predicted_s / warm.predicted_s - 1):+.2f}% vs priority modelled"
    return (
        f"{len(out.ranked)} distinct plans from {out.samples} samples over "
        f"{out.decisions} partition decisions; {out.stop}; best found by {best.found_by}"
        f"{gain}, {best.variant.non_default()} group(s) not on the rule's label"
    )


def best_partition(graph: OpGraph, out: JointOutcome) -> Partition:
    best = out.best
    return best.variant.partition if best is not None else Partition.singletons(graph)


__all__ = ["METHODS", "WARM", "Found", "JointOutcome", "best_partition", "describe", "run_joint"]
