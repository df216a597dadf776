"""The data-parallel gradient bucket size as a planning decision.

DDP packs gradients into 25 MiB buckets whatever the model and link. Here the size is
searched: every candidate is priced by the DP step (planner.distributed.dp: backward on
the compute stream, one α-β all-reduce per bucket on the communication stream, or, under
the `serial` step model, on the compute stream as well) and the fastest predicted wins. Candidates are powers of two from the smallest
gradient to the whole model, plus DDP's default, so the choice is never predicted worse
than the default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.distributed.dp import (
    DDP_BUCKET_BYTES,
    TWO_STREAM,
    BackwardStep,
    StepModel,
    dp_step_timeline,
    first_bucket_bytes,
)
from planner.errors import FusionPlannerError
from planner.plans.plan import DPChoice


@dataclass(frozen=True)
class BucketChoice:
    bucket_bytes: int
    predicted_s: float
    ddp_default_predicted_s: float
    table: tuple[tuple[int, float], ...]  # (candidate bytes, predicted step seconds)
    step_model: str = TWO_STREAM  # planner.distributed.dp.STEP_MODELS

    def record(self, ranks: int, link: str = "") -> DPChoice:
        """The decision as a Plan records it (planner.plans.plan.DPChoice)."""
        return DPChoice(
            self.bucket_bytes,
            ranks,
            self.predicted_s,
            self.ddp_default_predicted_s,
            link,
            self.step_model,
        )

    def predicted_for(self, bucket_bytes: int) -> float | None:
        """The predicted step of a candidate in the table, None if it was not priced."""
        return next((t for b, t in self.table if b == bucket_bytes), None)


def candidates(steps: Sequence[BackwardStep]) -> list[int]:
    sizes = [b for s in steps for b in s.grad_bytes]
    if not sizes:
        raise FusionPlannerError("the model has no parameter gradients to all-reduce")
    lo, total = max(1, min(sizes)), sum(sizes)
    out, c = {DDP_BUCKET_BYTES}, 1 << (lo - 1).bit_length()
    while c < 2 * total:
        out.add(c)
        c *= 2
    return sorted(out)


def search_bucket_size(
    steps: Sequence[BackwardStep],
    all_reduce_s: Callable[[int], float],
    forward_s: float = 0.0,
    ddp_first_bucket: bool = True,
    grid: Sequence[int] | None = None,
    step_model: StepModel | None = None,
) -> BucketChoice:
    """The bucket size with the shortest predicted DP step (ties: the larger bucket,
    fewer collectives to launch) under `step_model` (planner.distributed.dp.step_model_for;
    None: two streams). Each candidate is priced as DDP runs it when the plan
    is realized (planner.distributed.ddp): its first bucket as
    planner.distributed.dp.first_bucket_bytes says (1 MiB at DDP's default 25 MiB, the
    cap itself otherwise) where `ddp_first_bucket`, else the same cap as the others."""
    serial = step_model is not None and step_model.serial

    def predict(b: int) -> float:
        first = first_bucket_bytes(b) if ddp_first_bucket else None
        return dp_step_timeline(
            steps, b, all_reduce_s, forward_s, 0.0, first, serial_comm=serial
        ).makespan_s

    table = tuple((b, predict(b)) for b in (grid or candidates(steps)))
    best = min(table, key=lambda r: (r[1], -r[0]))
    name = step_model.name if step_model is not None else TWO_STREAM
    return BucketChoice(best[0], best[1], predict(DDP_BUCKET_BYTES), table, name)
