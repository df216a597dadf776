"""The Optuna search loop shared by the `tpe` and `nsga2` strategies.

One trial = one genome of the encoding (search/encoding.py), decoded to a legal partition
and scored by the cheap cost model (the inner objective; the tune loop measures only the
top-k plans on hardware). Around it:

- warm start: the all-True genome (exactly `priority`'s plan) and the genome closest to
  `greedy`'s plan are enqueued first (`enqueue_trial`), so the search starts from the
  heuristics and can only improve on the better of them;
- small spaces are enumerated: with k <= log2(enumerate_up_to) exposed decisions every
  genome is enqueued, so the answer is optimal over the encoding;
- budgets: trials (`max_trials`), no improvement for `patience` trials, and the strategy's
  Budget (evaluations, seconds); a decode cut short by the budget ends the study;
- a decoded partition seen before is answered from a cache, not evaluated again;
- pruning (optional, `prune=True`): the running modelled cost after each quarter of the
  merges is reported and Optuna's median pruner may stop the decode. Off by default: a
  trial that forbids an early big merge is behind at every checkpoint and ahead at the end,
  which is the very trial worth running (docs/search.md measures it);
- progress: a log line every `progress_every_s` seconds (trials, best so far vs priority);
- `study.optimize` (not ask/tell), so RDB heartbeats run for fleet workers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import progress as progress_bars
from planner.fusion.fuse_rules import default_partition
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Evaluation, Objective
from search.encoding import Encoding, build_encoding
from search.merge_env import OutOfBudget
from search.optuna_storage import (
    WORKER_ATTR,
    fail_dead_trials,
    make_storage,
    open_study,
    require_optuna,
    signature_of,
    storage_kind,
    worker_tag,
)
from search.strategy import Clock

log = logging.getLogger("search.optuna")
CHOICES = (True, False)  # True first: the categorical index 0 is "as priority"


@dataclass(frozen=True)
class OptunaSettings:
    """What the tpe / nsga2 strategies pass to `optimize`."""

    max_trials: int = 200
    patience: int = 100
    max_free: int = 64
    mode: str = "contested"
    warm_start: bool = True
    enumerate_up_to: int = 64
    prune: bool = False
    storage: str | None = None
    bucket_id: str = "adhoc"
    progress_every_s: float = 10.0
    heartbeat_s: int | None = None  # database storages: heartbeat interval (None: default)
    sweep_every_s: float = 2.0  # how often to fail trials of this host's dead workers


@dataclass
class Outcome:
    """What a study found: its best partition and, with two objectives, the Pareto front
    as (total_s, peak_memory_bytes, partition), fastest first."""

    partition: Partition
    complete: bool
    notes: str
    trials: int = 0
    front: list[tuple[float, int, Partition]] = field(default_factory=list)


class _Loop:
    """State of one `optimize` call: trial cache, stopping rules, progress."""

    def __init__(
        self,
        enc: Encoding,
        objective: Objective,
        clock: Clock,
        settings: OptunaSettings,
        n_objectives: int,
        label: str,
        max_trials: int,
        patience: int,
    ):
        self.enc, self.objective, self.clock, self.s = enc, objective, clock, settings
        self.n_objectives, self.label = n_objectives, label
        self.max_trials, self.patience = max_trials, patience
        self.memo: dict[int, float] = {}
        self.seen: dict[str, tuple[Partition, Evaluation]] = {}
        self.by_trial: dict[int, str] = {}  # trial number -> partition key (this process)
        self.best = math.inf
        self.since_best = 0
        self.trials = 0
        self.out_of_budget = False
        self.t_last_log = time.perf_counter()
        self.default = enc.default()
        self.reference = math.inf  # priority's score, for progress lines
        self.bar: progress_bars.Bar | None = None  # open while the study optimizes
        self.tag = worker_tag()
        self.t_last_sweep = time.perf_counter()

    def _stop(self, trial: Any, why: str) -> Exception:
        self.out_of_budget = True
        trial.study.stop()
        return require_optuna().TrialPruned(why)

    def __call__(self, trial: Any) -> float | tuple[float, float]:
        if self.s.storage is not None:  # shared study: who runs it, for fail_dead_trials
            trial.set_user_attr(WORKER_ATTR, self.tag)
        genome = {d.name: trial.suggest_categorical(d.name, CHOICES) for d in self.enc.decisions}
        if self.clock.exhausted(1):
            raise self._stop(trial, "budget exhausted")
        hook = self._pruning_hook(trial) if self.s.prune and self.n_objectives == 1 else None
        dec = self.enc.decode(self.objective, genome, self.clock, self.memo, on_merge=hook)
        if dec.stopped:
            raise require_optuna().TrialPruned("behind the median at a checkpoint")
        if not dec.complete:
            raise self._stop(trial, "budget ran out during the decode")
        got = self.seen.get(dec.partition.key)
        if got is None:
            if self.clock.exhausted(1):
                raise self._stop(trial, "budget exhausted")
            got = (dec.partition, self.objective.evaluate(dec.partition))
            self.seen[dec.partition.key] = got
        part, ev = got
        self.by_trial[trial.number] = part.key
        self.clock.offer(ev.score)
        if genome == self.default:
            self.reference = ev.score
        if self.n_objectives == 1:
            return ev.score
        return ev.score, float(ev.peak_memory_bytes)

    def _pruning_hook(self, trial: Any) -> Callable[[int, float], bool]:
        every = max(1, self.enc.expected_merges // 4)

        def hook(merges: int, total_s: float) -> bool:
            if merges % every:
                return False
            trial.report(total_s, merges)
            return bool(trial.should_prune())

        return hook

    def after_trial(self, study: Any, frozen: Any) -> None:
        """Callback: patience, trial cap, progress."""
        self.trials += 1
        value = frozen.values[0] if frozen.values else math.inf
        if value < self.best * (1 - 1e-12):
            self.best, self.since_best = value, 0
            if self.bar is not None and math.isfinite(value):
                self.bar.note(f"best {value * 1e6:.1f} us")
        else:
            self.since_best += 1
        if self.bar is not None:
            self.bar.update()
        if self.trials >= self.max_trials or self.since_best >= self.patience:
            study.stop()
        now = time.perf_counter()
        if self.s.storage is not None and now - self.t_last_sweep >= self.s.sweep_every_s:
            self.t_last_sweep = now
            fail_dead_trials(study)
        if now - self.t_last_log >= self.s.progress_every_s:
            self.t_last_log = now
            rel = self.best / self.reference - 1 if math.isfinite(self.reference) else math.nan
            log.info(
                "%s: %d trials, best %.3f us (%+.2f%% vs priority), %d evals, %.0f s",
                self.label,
                self.trials,
                self.best * 1e6,
                100 * rel,
                self.clock.evals,
                self.clock.seconds,
            )

    def partition_of(self, trial: Any) -> Partition | None:
        """The partition a complete trial decoded to (decoding another worker's trial)."""
        key = self.by_trial.get(trial.number) if trial.number in self.by_trial else None
        if key is not None:
            return self.seen[key][0]
        genome = {n: bool(trial.params.get(n, True)) for n in self.enc.names}
        dec = self.enc.decode(self.objective, genome, self.clock, self.memo)
        return dec.partition if dec.complete else None


def optimize(
    graph: OpGraph,
    objective: Objective,
    clock: Clock,
    *,
    sampler: Any,
    settings: OptunaSettings,
    directions: Sequence[str] = ("minimize",),
    label: str = "optuna",
) -> Outcome:
    """Search the encoding of `graph` with an Optuna sampler; see the module docstring."""
    opt = require_optuna()
    memo: dict[int, float] = {}  # group scores, shared by every decode of this search
    try:
        enc = build_encoding(
            graph, objective, mode=settings.mode, max_free=settings.max_free, clock=clock, memo=memo
        )
    except OutOfBudget:
        return Outcome(Partition.singletons(graph), False, "budget ran out building the encoding")
    if not enc.decisions:
        dec = enc.decode(objective, {}, clock, memo)
        return Outcome(dec.partition, dec.complete, "no contested decision: priority's plan")
    k = len(enc.decisions)
    enumerate_all = 2**k <= min(settings.enumerate_up_to, settings.max_trials)
    max_trials = 2**k if enumerate_all else settings.max_trials
    patience = max_trials if enumerate_all else settings.patience
    loop = _Loop(enc, objective, clock, settings, len(directions), label, max_trials, patience)
    loop.memo = memo
    signature = signature_of(
        objective.cost_model_label, enc.mode, enc.names, list(directions), objective.limits.source
    )
    pruner = opt.pruners.MedianPruner(n_startup_trials=10) if settings.prune else None
    storage = None
    if settings.heartbeat_s is not None and storage_kind(settings.storage) == "rdb":
        storage = make_storage(
            settings.storage,
            heartbeat_interval_s=settings.heartbeat_s,
            grace_period_s=3 * settings.heartbeat_s,
        )
    study = open_study(
        graph,
        settings.bucket_id,
        settings.storage,
        directions,
        sampler=sampler,
        pruner=pruner or opt.pruners.NopPruner(),
        signature=signature,
        storage=storage,
    )
    for genome in _seeds(graph, objective, clock, enc, settings, enumerate_all):
        study.enqueue_trial(genome, skip_if_exists=True)
    with progress_bars.bar(max_trials, f"search {label}", unit="trial") as loop.bar:
        study.optimize(loop, callbacks=[loop.after_trial], catch=(), gc_after_trial=False)
    if settings.storage is not None:
        fail_dead_trials(study)
    return _outcome(study, enc, loop, enumerate_all)


def _outcome(study: Any, enc: Encoding, loop: _Loop, enumerated: bool) -> Outcome:
    """The study's best (this worker's trials or any other's), or its Pareto front."""
    opt = require_optuna()
    done = [t for t in study.trials if t.state == opt.trial.TrialState.COMPLETE and t.values]
    ours = len(loop.by_trial)
    head = (
        f"{len(enc.decisions)} of {enc.n_links_total} links+patterns exposed ({enc.mode}), "
        f"{ours} trials here, {len(done)} in the study"
    )
    complete = not loop.out_of_budget
    if enumerated and complete:
        head += f"; all 2^{len(enc.decisions)} genomes enumerated: optimal over the encoding"
    if not done:
        dec = enc.decode(loop.objective, enc.default(), loop.clock, loop.memo)
        return Outcome(dec.partition, False, f"{head}; no trial finished")
    front: list[tuple[float, int, Partition]] = []
    if loop.n_objectives > 1:
        seen: set[str] = set()
        for t in sorted(study.best_trials, key=lambda t: (t.values[0], t.values[1], t.number)):
            if not math.isfinite(t.values[0]):
                continue  # infeasible (a bound broken, or the cost model failed)
            part = loop.partition_of(t)
            if part is not None and part.key not in seen:
                seen.add(part.key)
                front.append((t.values[0], int(t.values[1]), part))
        head += f"; Pareto front of {len(front)} plans (latency, peak memory)"
    ranked = sorted(done, key=lambda t: (t.values[0], t.number))
    for t in ranked[:3]:  # another worker's best may not decode within our budget
        part = loop.partition_of(t)
        if part is not None:
            return Outcome(part, complete, head, trials=ours, front=front)
    dec = enc.decode(loop.objective, enc.default(), loop.clock, loop.memo)
    return Outcome(dec.partition, False, f"{head}; best trials could not be decoded", ours, front)


def _seeds(
    graph: OpGraph,
    objective: Objective,
    clock: Clock,
    enc: Encoding,
    settings: OptunaSettings,
    enumerate_all: bool,
) -> list[dict[str, bool]]:
    """Genomes to enqueue: every genome of a small space, else priority's and greedy's."""
    if enumerate_all:
        names = enc.names
        return [
            {n: not bool(code >> j & 1) for j, n in enumerate(names)}
            for code in range(2 ** len(names))
        ]
    out = [enc.default()]
    if settings.warm_start:
        g = enc.encode(default_partition(graph, objective.limits))  # greedy's plan
        if g != out[0]:
            out.append(g)
    return out
