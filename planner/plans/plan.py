"""The Plan record: a partition, how each group is realized, and what it was made under.

Plans are what strategies return, what realization executes, what the plan cache
stores and what the runtime looks up. They persist as JSON (never pickle), with a schema
version so an old or foreign record is recognised rather than misread.
"""

from __future__ import annotations

import datetime as _dt
import difflib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from planner.distributed.dp import STEP_MODELS
from planner.errors import PlanError
from planner.fusion.legality import check
from planner.fusion.partition import Partition
from planner.fusion.realization import LABELS, RULE_VERSION, realizations_of
from planner.ir.graph import OpGraph

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GroupPlan:
    """One group: its nodes, how it runs (planner.fusion.realization; "" = not recorded, derived
    by the rule when realized), its predicted latency, and the ops of other groups it
    recomputes from their inputs instead of reading their results (planner.fusion.recompute;
    absent from records written before recompute existed, which load with none)."""

    nodes: tuple[int, ...]
    realization: str = ""
    predicted_s: float = 0.0
    recompute: tuple[int, ...] = ()  # ops of other groups this one recomputes

    def __post_init__(self) -> None:
        if self.realization and self.realization not in LABELS:
            raise PlanError(f"unknown realization {self.realization!r}; use one of {LABELS}")
        if set(self.recompute) & set(self.nodes):
            raise PlanError("a group recomputes one of its own ops")


@dataclass(frozen=True)
class TPChoice:
    """The tensor-parallel decision a plan records for a rank program's column -> row
    sites (planner.distributed.tp_graph), one per site: site i's row-parallel GEMM runs
    over `chunks[i]` token slices, each slice all-reduced asynchronously, and with
    `fuse_epilogue[i]` the ops after its all-reduce run as one unit. `sites` are the
    row-parallel GEMMs' node names, in program order. A single value (an int, a bool: what
    records written before per-site decisions hold) means the same for every site, and a
    decision that is the same for every site is written that way. `predicted_s` is the
    forward's predicted total, `predicted_backward_s` the backward's (unchunked: the same
    for every decision), None where it was not priced."""

    chunks: tuple[int, ...]
    fuse_epilogue: tuple[bool, ...]
    sites: tuple[str, ...]
    predicted_s: float = 0.0
    predicted_backward_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sites, tuple | list) or not self.sites:
            raise PlanError(f"a tensor-parallel decision names its sites, got {self.sites!r}")
        if not all(isinstance(s, str) and s for s in self.sites):
            raise PlanError(f"a tensor-parallel decision names its sites, got {self.sites!r}")
        object.__setattr__(self, "sites", tuple(self.sites))
        n = len(self.sites)
        chunks = _per_site(self.chunks, n, "chunks")
        fused = _per_site(self.fuse_epilogue, n, "fuse_epilogue")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in chunks):
            raise PlanError(f"a tensor-parallel decision needs chunks >= 1, got {self.chunks!r}")
        if not all(isinstance(f, bool) for f in fused):
            raise PlanError(f"fuse_epilogue must be true or false, got {self.fuse_epilogue!r}")
        object.__setattr__(self, "chunks", chunks)
        object.__setattr__(self, "fuse_epilogue", fused)

    @property
    def uniform(self) -> bool:
        """Whether every site has the same decision."""
        return len(set(zip(self.chunks, self.fuse_epilogue))) == 1

    @property
    def label(self) -> str:
        """ "k=2 fused" for a decision every site shares, else each site's, in order
        ("k=2 fused | k=1")."""
        one = [f"k={k}{' fused' if f else ''}" for k, f in zip(self.chunks, self.fuse_epilogue)]
        return one[0] if self.uniform else " | ".join(one)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["sites"] = list(self.sites)
        if self.uniform:  # as records without per-site decisions: old readers read it
            d["chunks"], d["fuse_epilogue"] = self.chunks[0], self.fuse_epilogue[0]
        else:
            d["chunks"], d["fuse_epilogue"] = list(self.chunks), list(self.fuse_epilogue)
        return d

    @classmethod
    def from_json(cls, data: Any) -> TPChoice:
        if not isinstance(data, dict):
            raise PlanError(f"tensor_parallel must be an object, got {type(data).__name__}")
        try:
            back = data.get("predicted_backward_s")
            chunks, fused = data["chunks"], data["fuse_epilogue"]
            return cls(
                tuple(chunks) if isinstance(chunks, list) else chunks,
                tuple(fused) if isinstance(fused, list) else fused,
                tuple(data["sites"]),
                float(data.get("predicted_s", 0.0)),
                None if back is None else float(back),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"the plan's tensor_parallel record is malformed: {e}") from e


@dataclass(frozen=True)
class DPChoice:
    """The data-parallel decision a plan records for a graph whose gradients are
    all-reduced in buckets (planner.distributed.dp): the gradient bucket size, over
    `ranks` ranks on the link named `link`, with the step it predicts and what DDP's
    default 25 MiB bucket predicts under the same model. `step_model` names that model
    (planner.distributed.dp.STEP_MODELS: "two-stream" or "serial"); "" in records
    written before it was recorded, which were priced on two streams."""

    bucket_bytes: int
    ranks: int
    predicted_s: float
    ddp_default_predicted_s: float
    link: str = ""
    step_model: str = ""

    def __post_init__(self) -> None:
        for name in ("bucket_bytes", "ranks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"a data-parallel decision needs {name} >= 1, got {v!r}")
        if self.step_model not in ("", *STEP_MODELS):
            raise PlanError(
                f"unknown DP step model {self.step_model!r}; use one of {', '.join(STEP_MODELS)}"
            )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> DPChoice:
        if not isinstance(data, dict):
            raise PlanError(f"data_parallel must be an object, got {type(data).__name__}")
        try:
            return cls(
                data["bucket_bytes"],
                data["ranks"],
                float(data["predicted_s"]),
                float(data["ddp_default_predicted_s"]),
                str(data.get("link", "")),
                str(data.get("step_model", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"the plan's data_parallel record is malformed: {e}") from e


def _per_site(value: Any, n: int, name: str) -> tuple[Any, ...]:
    """`value` for each of `n` sites: a single value for every site, or one per site."""
    if isinstance(value, tuple | list):
        if len(value) != n:
            raise PlanError(f"{name} gives {len(value)} values for {n} sites: give one per site")
        return tuple(value)
    return (value,) * n


def versions() -> dict[str, str]:
    """The versions every plan and measurement records."""
    return {
        "torch": torch.__version__.split("+")[0],
        "planner_schema": str(SCHEMA_VERSION),
        "realization_rule": RULE_VERSION,
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Plan:
    """A fusion plan for one graph on one device.

    `predicted_s` is the objective's value under `cost_model`; `measured_s` and
    `measured_p99_s` are filled in once the plan ran on the device (profiling): a call
    through the serving path, calls back to back. `measured_synced_s`: one such call
    alone, waited for (the wall clock, the device idle before it), what a loop that needs
    each result sees; None where it was not measured (and in records written before it
    existed).
    `tensor_parallel`: the decision for a tensor-parallel rank program's sites (None for
    other programs, and in records written before it existed). `data_parallel`: the
    gradient bucket decision of a graph holding a data-parallel gradient sync (None
    otherwise, and in records written before it existed).
    """

    graph_key: str
    structure_key: str
    device: str  # device spec name, e.g. "h100"
    dtype: str
    groups: tuple[GroupPlan, ...]
    strategy: str
    cost_model: str  # "name/version" of the model that predicted it
    predicted_s: float
    measured_s: float | None = None
    measured_p99_s: float | None = None
    eager_s: float | None = None
    device_fingerprint: str = ""
    versions: dict[str, str] = field(default_factory=versions)
    created_at: str = field(default_factory=now_iso)
    notes: str = ""
    tensor_parallel: TPChoice | None = None
    data_parallel: DPChoice | None = None
    measured_synced_s: float | None = None

    def unmeasured(self) -> Plan:
        """This plan without its measurements: the plan stored for shapes it was not
        timed at."""
        return replace(
            self, measured_s=None, measured_p99_s=None, eager_s=None, measured_synced_s=None
        )

    @classmethod
    def from_partition(
        cls,
        partition: Partition,
        *,
        device: str,
        dtype: str,
        strategy: str,
        cost_model: str,
        predicted_s: float,
        group_costs: tuple[float, ...] | None = None,
        realizations: tuple[str, ...] | None = None,
        **kw: Any,
    ) -> Plan:
        """The plan of `partition`; `realizations` per group default to the realization
        rule's labels (planner.fusion.realization), the ones realize runs."""
        n = len(partition)
        costs = group_costs or (0.0,) * n
        reals = realizations or realizations_of(partition.graph, partition.groups)
        if len(reals) != n:
            raise PlanError(f"{len(reals)} realizations for {n} groups")
        groups = tuple(
            GroupPlan(tuple(sorted(g)), r, c) for g, r, c in zip(partition.groups, reals, costs)
        )
        g = partition.graph
        return cls(
            graph_key=g.key,
            structure_key=g.structure_key,
            device=device,
            dtype=dtype,
            groups=groups,
            strategy=strategy,
            cost_model=cost_model,
            predicted_s=predicted_s,
            **kw,
        )

    def partition(self, graph: OpGraph) -> Partition:
        """The partition of `graph` this plan describes; the graph must be the plan's."""
        if graph.key != self.graph_key:
            raise PlanError(
                f"plan was made for graph {self.graph_key} but was given {graph.key} "
                "(another model or other shapes): look up or make a plan for this graph"
            )
        return Partition.from_groups(graph, (gp.nodes for gp in self.groups))

    def partition_for(self, graph: OpGraph) -> Partition:
        """The plan's partition applied to `graph`, the same model at other shapes.

        A plan made at a shape bucket's representative shape serves every shape of the
        bucket (planner.plans.cache, planner.runtime.backend): the graph must have the plan's
        `structure_key` (same ops, topology and parameters) and node count, so node
        indices mean the same ops; its activation shapes may differ.
        """
        if graph.structure_key != self.structure_key or len(graph.nodes) != sum(
            len(gp.nodes) for gp in self.groups
        ):
            raise PlanError(
                f"plan was made for model structure {self.structure_key} "
                f"({sum(len(gp.nodes) for gp in self.groups)} ops) but was given "
                f"{graph.structure_key} ({len(graph.nodes)} ops): another model, dtype or "
                "parameter shape; look up or make a plan for this model"
            )
        return Partition.from_groups(graph, (gp.nodes for gp in self.groups))

    def aligned_to(self, source: OpGraph, graph: OpGraph) -> Plan:
        """The plan, made for `source`, carried over to `graph`: the same model traced at
        other shapes, where export may keep or drop a few ops (an identity slice at one
        length is a real slice at another). The two graphs' ops are lined up in order by
        their targets; each group keeps the ops that line up, an op of `graph` that does
        not runs as a group of its own, and ops of `source` that `graph` lacks are dropped.
        Raises PlanError where the graphs do not line up well enough (more ops left
        unmatched on the two sides together than two, or a tenth of either graph), where the result is not a legal partition, and
        for a plan with a tensor-parallel decision (its sites are this graph's)."""
        if self.tensor_parallel is not None:
            raise PlanError("a plan with a tensor-parallel decision is not carried across graphs")
        if len(source.nodes) != sum(len(gp.nodes) for gp in self.groups):
            raise PlanError("the plan was not made for the source graph")
        if graph.structure_key == source.structure_key and len(graph.nodes) == len(source.nodes):
            self.partition_for(graph)
            return replace(self, graph_key=graph.key)
        a = [n.target for n in source.nodes]
        b = [n.target for n in graph.nodes]
        blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
        to: dict[int, int] = {}
        for blk in blocks:
            to.update((blk.a + k, blk.b + k) for k in range(blk.size))
        unmatched = len(a) + len(b) - 2 * len(to)
        if unmatched > max(2, len(a) // 10, len(b) // 10):
            raise PlanError(
                f"the graphs do not line up ({len(to)} of {len(a)} and {len(b)} ops match)"
            )
        groups = []
        for gp in self.groups:
            nodes = tuple(sorted(to[i] for i in gp.nodes if i in to))
            if nodes:
                recompute = tuple(sorted(to[i] for i in gp.recompute if i in to))
                groups.append(replace(gp, nodes=nodes, recompute=recompute))
        covered = {i for gp in groups for i in gp.nodes}
        groups += [GroupPlan((i,)) for i in range(len(b)) if i not in covered]
        report = check(Partition.from_groups(graph, (gp.nodes for gp in groups)))
        if not report.ok:
            raise PlanError("the plan carried over is not legal: " + "; ".join(report.reasons[:3]))
        return replace(
            self,
            graph_key=graph.key,
            structure_key=graph.structure_key,
            groups=tuple(sorted(groups, key=lambda gp: gp.nodes[0])),
        )

    def with_measurement(
        self, median_s: float, p99_s: float | None = None, eager_s: float | None = None, **kw: Any
    ) -> Plan:
        return replace(
            self,
            measured_s=median_s,
            measured_p99_s=p99_s,
            eager_s=eager_s if eager_s is not None else self.eager_s,
            **kw,
        )

    def copies(self) -> tuple[tuple[int, int], ...]:
        """(group mask, copy mask) per group that recomputes ops of others, by group mask
        (planner.fusion.recompute.Copies)."""
        out = []
        for gp in self.groups:
            if gp.recompute:
                out.append((sum(1 << i for i in gp.nodes), sum(1 << i for i in gp.recompute)))
        return tuple(sorted(out))

    def with_copies(self, copies: tuple[tuple[int, int], ...]) -> Plan:
        """This plan with each group's recomputed ops set from `copies` (by group mask)."""
        by_mask = dict(copies)
        groups = []
        for gp in self.groups:
            c = by_mask.get(sum(1 << i for i in gp.nodes), 0)
            groups.append(
                replace(gp, recompute=tuple(i for i in range(c.bit_length()) if c >> i & 1))
            )
        return replace(self, groups=tuple(groups))

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for g in d["groups"]:  # a group without copies is written as before recompute
            if not g["recompute"]:
                del g["recompute"]
        if self.tensor_parallel is None:  # written as before the field existed
            del d["tensor_parallel"]
        else:
            d["tensor_parallel"] = self.tensor_parallel.to_json()
        if self.data_parallel is None:  # written as before the field existed
            del d["data_parallel"]
        else:
            d["data_parallel"] = self.data_parallel.to_json()
        if self.measured_synced_s is None:  # likewise
            del d["measured_synced_s"]
        d["schema"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        if data.get("schema") != SCHEMA_VERSION:
            raise PlanError(
                f"plan record has schema {data.get('schema')}, expected {SCHEMA_VERSION}"
            )
        d = {k: v for k, v in data.items() if k != "schema"}
        try:
            d["groups"] = tuple(
                GroupPlan(
                    tuple(g["nodes"]),
                    g.get("realization") or "",
                    g["predicted_s"],
                    tuple(int(i) for i in g.get("recompute") or ()),
                )
                for g in d["groups"]
            )
            tp = d.get("tensor_parallel")
            d["tensor_parallel"] = None if tp is None else TPChoice.from_json(tp)
            dp = d.get("data_parallel")
            d["data_parallel"] = None if dp is None else DPChoice.from_json(dp)
            return cls(**d)
        except (KeyError, TypeError) as e:
            raise PlanError(f"plan record is malformed: {e}") from e
