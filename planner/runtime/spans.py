"""Adjacent tuned buckets that hold the same plan, realized once over their joint range.

`fusion-plan tune` stores a plan per bucket, and neighbouring buckets often get the same
partition (the same strategy's merges at a larger size). Each realization costs a compile
of every fused group (seconds on a GPU), so the backend realizes such a run of buckets
once, exported over the union of their ranges: the same kernels serve every shape of
the run, as a bucket's realization serves every shape of its bucket.

Only buckets the cache holds a tuned plan for are joined (never the default plan's
misses: an untuned model's pow2 buckets have no upper bound, and a model may not export
over a range it cannot run, such as lengths past its position table), along one size
that moves (the dynamic dims whose bucket range is wider than one size, all with the
same range: a sequence length shared by the ids and their mask). A plan is "the same"
when its groups (ops, realization, recompute), its graph structure and its
tensor-parallel decision are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planner.plans.buckets import Bucket, BucketSpec
from planner.plans.cache import BUCKET, PlanCache
from planner.plans.plan import Plan

MAX_JOINED = 16  # buckets one realization may serve


def signature(plan: Plan) -> tuple[Any, ...]:
    """What must be equal for two buckets' plans to share one realization."""
    groups = tuple((g.nodes, g.realization, g.recompute) for g in plan.groups)
    return (plan.structure_key, groups, plan.tensor_parallel)


def _moving(bucket: Bucket) -> tuple[list[tuple[int, int]], tuple[int, int]] | None:
    """The (input, axis) positions of the one size that moves, and its range."""
    ranged = [
        ((i, a), d)
        for i, shape in enumerate(bucket.dims)
        for a, d in enumerate(shape)
        if not isinstance(d, int) and d[0] < d[1]
    ]
    if not ranged or len({d for _, d in ranged}) != 1:
        return None
    return [p for p, _ in ranged], ranged[0][1]


def _at(shapes: Sequence[Sequence[int]], positions: list[tuple[int, int]], size: int):
    out = [list(s) for s in shapes]
    for i, a in positions:
        out[i][a] = size
    return tuple(tuple(s) for s in out)


def joined(
    bucket: Bucket,
    plan: Plan,
    shapes: Sequence[Sequence[int]],
    *,
    cache: PlanCache,
    model_key: str,
    device_fp: str,
    spec: BucketSpec,
) -> tuple[Bucket, tuple[Bucket, ...]]:
    """(the range to realize `plan` over, the buckets it serves): `bucket` widened over
    the adjacent tuned buckets whose plan has the same signature; `bucket` alone when
    none does."""
    moving = _moving(bucket)
    if moving is None:
        return bucket, (bucket,)
    positions, (lo, hi) = moving
    want = signature(plan)
    covered = [bucket]

    def neighbour(size: int) -> tuple[Bucket, tuple[int, int]] | None:
        """The tuned bucket holding `size` with the same plan, and its range."""
        if size < 1:
            return None
        at = _at(shapes, positions, size)
        b = spec.bucket_of(at)
        moves = None if b is None else _moving(b)
        if moves is None:
            return None
        found = cache.lookup(model_key, at, device_fp, spec=spec)
        if found.source != BUCKET or found.plan is None or signature(found.plan) != want:
            return None
        return b, moves[1]

    for step in (1, -1):
        while len(covered) < MAX_JOINED:
            hit = neighbour(hi + 1 if step > 0 else lo - 1)
            if hit is None:
                break
            b, (b_lo, b_hi) = hit
            lo, hi = min(lo, b_lo), max(hi, b_hi)
            covered.append(b)
    if len(covered) == 1:
        return bucket, (bucket,)
    dims = tuple(
        tuple((lo, hi) if (i, a) in positions else d for a, d in enumerate(shape))
        for i, shape in enumerate(bucket.dims)
    )
    return Bucket(dims), tuple(covered)
