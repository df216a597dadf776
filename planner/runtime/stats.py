"""What the runtime backend did (`FusionPlannerBackend.stats`): hits, misses, compiles,
fallbacks and static specializations, counted as they happen."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RuntimeStats:
    """What the backend did; read it to see hits, misses and compiles."""

    graphs: int = 0
    realized: int = 0  # realizations paid for (each counts against the compile budget)
    exact: int = 0  # new shapes served by an exact-shape plan
    bucket: int = 0  # ... by their bucket's plan
    default: int = 0  # ... by the default plan (a miss)
    over_budget: int = 0  # new buckets run as dynamo's graph, the budget being spent
    fallbacks: list[str] = field(default_factory=list)  # why a bucket ran dynamo's graph
    queued: int = 0  # misses recorded in the tuning queue
    # graphs that hold no tensor at all (Python arithmetic on sizes dynamo compiled between
    # graph breaks): nothing to plan, run as they are
    tensorless: int = 0
    grad_graphs: int = 0  # graphs served in grad mode (plan forward, eager recomputed backward)
    static: int = 0  # recurring shapes given a static specialization of their bucket's plan
    static_failed: list[str] = field(default_factory=list)  # why a specialization was not made
    static_skipped: int = 0  # recurring shapes left unspecialized, the static budget spent
    static_build_s: float = 0.0  # seconds spent building static specializations
    # share of a call each specialization saved, timed against its bucket realization's
    # calls at that shape (static_after="auto"); one that lost (< 0) was dropped again
    static_gains: list[float] = field(default_factory=list)
    # cached plans that did not fit the ops the model traced into at a call's shapes (the
    # default plan ran instead)
    unfitted: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)  # grad-mode graphs given to Inductor: why
    # tuned buckets served by the realization of an adjacent bucket with the same plan,
    # exported over their joint range (planner.runtime.spans): compiles not paid
    joined: int = 0
    # buckets that could not be exported over their range, so each of their shapes is
    # realized alone (a compile per shape, against the budget): the bucket and why
    per_shape: list[str] = field(default_factory=list)
