"""The fusion objective (docs/formulas.md §4, §5, §12): what a partition costs.

    cost(P) = sum over groups G of C(G)  +  sum over boundary tensors t of T(t)

C(G) is the cost model's latency of G run as one unit: max(T_compute, T_memory) + T_launch
with T_memory over G's *boundary* bytes (planner.cost.group_io: each boundary input read
once by G, each boundary output written once by its producer group, tensors inside G
free). So C already charges every byte that crosses a boundary, once on each side, and
every launch. T is what remains per boundary activation tensor read by a group other than
its producer: `TransferModel.sync_s`, the wait for the producer kernel to finish (0 by
default: on one CUDA stream kernels are ordered anyway and the launch gap is in C; set it
for multi-stream or cross-device what-ifs). Graph inputs and parameters are not transfers
(nothing produced them in this graph). docs/objective.md has the same definition with a
worked example.

Both terms are sums of per-group quantities (a group's C and the T of the tensors it reads
from other groups), so score(G) = C(G) + T_in(G) is cached by (graph.key, mask) and the
exact planner can do dynamic programming over it.

Constraints and extra objectives, reported for every partition: the critical path of the
graph of groups (docs/formulas.md §5: must stay <= L_max when a bound is set) and the peak bytes of
boundary tensors alive at once when the groups run in the plan's order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.cost import CostModel, GroupCost, group_io
from planner.fusion.legality import check
from planner.fusion.partition import Partition, bits
from planner.fusion.realization import (  # realization_of: re-exported
    realization_of,
    realizations_of,
)
from planner.fusion.resources import ResourceLimits
from planner.hardware import DeviceSpec
from planner.ir.graph import OpGraph
from planner.plans.plan import Plan

INF = math.inf


@dataclass(frozen=True)
class TransferModel:
    """T(t): cost of one boundary activation tensor, beyond the bytes C already charges."""

    sync_s: float = 0.0  # dependency wait per tensor a group reads from another group

    def tensor_s(self, graph: OpGraph, tid: int) -> float:
        return self.sync_s


@dataclass(frozen=True)
class Evaluation:
    """What a partition costs under an Objective. Times in seconds, sizes in bytes."""

    total_s: float  # sum of C + sum of T; inf when illegal or when the cost model failed
    group_costs: tuple[GroupCost, ...]  # aligned with partition.groups
    compute_s: float  # sum of C(G)
    transfer_s: float  # sum of T(t)
    critical_path_s: float
    peak_memory_bytes: int
    boundary_bytes: int  # sum over groups of bytes_in + bytes_out
    legal: bool
    reasons: tuple[str, ...]
    feasible: bool  # legal and every bound met
    n_groups: int
    n_kernels: int

    @property
    def score(self) -> float:
        """What strategies minimize: total_s when feasible, else infinity."""
        return self.total_s if self.feasible else INF


class Objective:
    """Scores partitions of graphs with a cost model; caches group scores per (graph, mask).

    `n_evals` counts every scoring request (partition evaluations and group scores, cached
    or not): the unit of a search budget. `n_model_calls` counts cost-model calls (misses).
    The cache is keyed by the model's `version` too, so a model that learns online (its
    version changes) is asked again. Not thread-safe (one per search).
    """

    def __init__(
        self,
        cost_model: CostModel,
        *,
        spec: DeviceSpec | None = None,
        latency_bound_s: float | None = None,
        memory_bound_bytes: int | None = None,
        transfer: TransferModel | None = None,
    ):
        self.cost_model = cost_model
        self.spec = spec if spec is not None else getattr(cost_model, "spec", None)
        self.limits = ResourceLimits.for_spec(self.spec)
        self.latency_bound_s = latency_bound_s
        self.memory_bound_bytes = memory_bound_bytes
        self.transfer = transfer or TransferModel()
        self.n_evals = 0
        self.n_model_calls = 0
        self._cost: dict[tuple[str, str], dict[int, GroupCost]] = {}
        self._xfer: dict[str, dict[int, float]] = {}

    def __repr__(self) -> str:
        return f"Objective({self.cost_model_label}, limits={self.limits.source})"

    @property
    def cost_model_label(self) -> str:
        return f"{self.cost_model.name}/{self.cost_model.version}"

    # ---- per group ---------------------------------------------------------------------
    def group_cost(self, graph: OpGraph, mask: int) -> GroupCost:
        """C(G), cached per (graph, model version); raises what the cost model raises."""
        cache = self._cost.setdefault((graph.key, str(self.cost_model.version)), {})
        got = cache.get(mask)
        if got is None:
            self.n_model_calls += 1
            got = self.cost_model.group_cost(graph, frozenset(bits(mask)))
            cache[mask] = got
        return got

    def group_transfer_s(self, graph: OpGraph, mask: int) -> float:
        """T of the activation tensors group `mask` reads from other groups."""
        cache = self._xfer.setdefault(graph.key, {})
        got = cache.get(mask)
        if got is None:
            got = 0.0
            if self.transfer.sync_s:
                for t in group_io(graph, bits(mask)).inputs:
                    if graph.tensors[graph.root(t)].producer is not None:
                        got += self.transfer.tensor_s(graph, t)
            cache[mask] = got
        return got

    def group_score(self, graph: OpGraph, mask: int) -> float:
        """C(G) + T_in(G): G's share of the objective; inf if the cost model fails."""
        self.n_evals += 1
        try:
            return self.group_cost(graph, mask).latency_s + self.group_transfer_s(graph, mask)
        except Exception:  # a failing candidate is infinitely expensive, never an error
            return INF

    # ---- per partition -----------------------------------------------------------------
    def evaluate(self, partition: Partition) -> Evaluation:
        """Cost, legality, critical path and peak memory of `partition`. Never raises."""
        self.n_evals += 1
        g = partition.graph
        report = check(partition, self.limits)
        reasons = report.reasons
        try:
            costs = tuple(self.group_cost(g, m) for m in partition.masks)
            xfer = tuple(self.group_transfer_s(g, m) for m in partition.masks)
        except Exception as e:  # reported as a reason, scored as inf
            return _failed(partition, (*reasons, f"cost model failed: {type(e).__name__}: {e}"))
        compute = sum(c.latency_s for c in costs)
        transfer = sum(xfer)
        order = partition.topo_order()
        if order is None:
            crit, peak = INF, peak_boundary_bytes(partition, None)
        else:
            crit = _critical_path(partition, order, [c.latency_s + x for c, x in zip(costs, xfer)])
            peak = peak_boundary_bytes(partition, order)
        total = compute + transfer if report.ok else INF
        bounds_ok = (self.latency_bound_s is None or crit <= self.latency_bound_s) and (
            self.memory_bound_bytes is None or peak <= self.memory_bound_bytes
        )
        notes = list(reasons)
        if self.latency_bound_s is not None and crit > self.latency_bound_s:
            notes.append(
                f"latency bound: critical path {crit * 1e6:.1f} us > L_max "
                f"{self.latency_bound_s * 1e6:.1f} us"
            )
        if self.memory_bound_bytes is not None and peak > self.memory_bound_bytes:
            notes.append(f"memory bound: peak {peak} B > {self.memory_bound_bytes} B")
        return Evaluation(
            total_s=total,
            group_costs=costs,
            compute_s=compute,
            transfer_s=transfer,
            critical_path_s=crit,
            peak_memory_bytes=peak,
            boundary_bytes=sum(c.bytes_in + c.bytes_out for c in costs),
            legal=report.ok,
            reasons=tuple(notes),
            feasible=report.ok and bounds_ok and math.isfinite(total),
            n_groups=len(partition),
            n_kernels=sum(1 for c in costs if c.t_launch_s > 0),
        )

    def unfused(self, graph: OpGraph) -> Evaluation:
        """The baseline: one kernel per op."""
        return self.evaluate(Partition.singletons(graph))

    # ---- plans -------------------------------------------------------------------------
    def make_plan(
        self,
        partition: Partition,
        evaluation: Evaluation,
        *,
        strategy: str,
        device: str,
        dtype: str,
        **kw: Any,
    ) -> Plan:
        """A Plan record with each group's realization label (planner.fusion.realization: the
        label realize runs and the cost models scored)."""
        return Plan.from_partition(
            partition,
            device=device,
            dtype=dtype,
            strategy=strategy,
            cost_model=self.cost_model_label,
            predicted_s=evaluation.total_s,
            group_costs=tuple(c.latency_s for c in evaluation.group_costs),
            realizations=realizations_of(partition.graph, partition.masks),
            **kw,
        )


def _failed(partition: Partition, reasons: tuple[str, ...]) -> Evaluation:
    return Evaluation(INF, (), INF, 0.0, INF, 0, 0, False, reasons, False, len(partition), 0)


def _critical_path(partition: Partition, order: tuple[int, ...], lat: list[float]) -> float:
    """Longest latency path through the graph of groups (docs/formulas.md §5)."""
    preds: list[list[int]] = [[] for _ in partition.masks]
    for a, b in partition.group_edges:
        preds[b].append(a)
    finish = [0.0] * len(partition.masks)
    for gi in order:
        finish[gi] = lat[gi] + max((finish[p] for p in preds[gi]), default=0.0)
    return max(finish, default=0.0)


def peak_boundary_bytes(partition: Partition, order: tuple[int, ...] | None) -> int:
    """Peak bytes of boundary activations alive at once, groups run in `order`.

    A boundary activation (storage root written by one group and read by another, or
    returned) is allocated when its group runs and freed after its last reader group;
    graph outputs stay alive to the end. Inputs and parameters belong to the caller.
    """
    g = partition.graph
    go = partition.group_of
    order = order if order is not None else tuple(range(len(partition)))
    pos = {gi: k for k, gi in enumerate(order)}
    outputs = {g.root(t) for t in g.outputs}
    alloc: dict[int, list[int]] = {}  # step -> roots allocated
    free_at: dict[int, list[int]] = {}  # step -> roots freed after it
    size: dict[int, int] = {}
    views = _aliases(g)
    for t in g.tensors:
        if t.producer is None or t.alias_of is not None:
            continue
        readers = {go[c] for v in views.get(t.id, (t.id,)) for c in g.consumers[v]}
        home = go[t.producer]
        readers.discard(home)
        if not readers and t.id not in outputs:
            continue  # lives and dies inside its group
        size[t.id] = t.nbytes
        alloc.setdefault(pos[home], []).append(t.id)
        last = len(order) if t.id in outputs else max(pos[r] for r in readers)
        free_at.setdefault(last, []).append(t.id)
    live = peak = 0
    for step in range(len(order)):
        live += sum(size[r] for r in alloc.get(step, ()))
        peak = max(peak, live)
        live -= sum(size[r] for r in free_at.get(step, ()))
    return peak


_ALIASES: dict[str, dict[int, tuple[int, ...]]] = {}


def _aliases(g: OpGraph) -> dict[int, tuple[int, ...]]:
    """root tensor id -> (root, every view of it), for roots that have views."""
    got = _ALIASES.get(g.key)
    if got is None:
        acc: dict[int, list[int]] = {}
        for t in g.tensors:
            if t.alias_of is not None:
                acc.setdefault(t.alias_of, [t.alias_of]).append(t.id)
        got = {r: tuple(v) for r, v in acc.items()}
        if len(_ALIASES) > 64:
            _ALIASES.clear()
        _ALIASES[g.key] = got
    return got


__all__ = [
    "Evaluation",
    "Objective",
    "TransferModel",
    "peak_boundary_bytes",
    "realization_of",
]
