"""Checking a realized plan against eager on fresh inputs, before its timings are trusted.

`planner.realize.realizer` checks every plan on the capture's example inputs; this is the
measuring side's check: more trials, each on new random inputs of every kind (floats
standard normal, token ids and other integers uniform over the example's range, masks as
given: planner.realize.check.fresh_inputs), judged by the one accuracy rule of
planner.realize.check (re-exported here; it lives in `planner` because the runtime needs
it and may not import profiling). A realized plan that fails on new inputs is repaired as
realize repairs it: only the groups responsible fall back, and the report names them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.realize.check import (
    FLOOR_ULPS,
    LOW_PRECISION_MULTIPLIER,
    MULTIPLIER,
    TOLERANCES,
    Mismatch,
    Tolerance,
    check_callable,
    compare_outputs,
    fresh_inputs,
    model_dtype,
    short_reason,
    tolerance_for,
)
from planner.realize.realizer import RealizedPlan

__all__ = [
    "TOLERANCES",
    "Mismatch",
    "Tolerance",
    "VerifyReport",
    "compare_outputs",
    "fresh_inputs",
    "tolerance_for",
    "verify_against_eager",
]


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of `verify_against_eager`: trials run, the first mismatch (None = agree),
    what the plan was judged against, and the groups that run eagerly with the reason."""

    trials: int
    mismatch: Mismatch | None
    dtype: str
    reference: str = ""
    fallbacks: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.mismatch is None

    def __str__(self) -> str:
        if not self.ok:
            return f"DISAGREES with eager: {self.mismatch}"
        if self.reference.startswith("fixed") or not self.reference:
            tol = tolerance_for(self.dtype)
            rule = f"{self.dtype}: rtol {tol.rtol}, atol {tol.atol}"
        else:
            low = torch.finfo(getattr(torch, self.dtype, torch.float32)).bits <= 16
            mult = LOW_PRECISION_MULTIPLIER if low else MULTIPLIER
            rule = f"vs {self.reference}: within {mult:g}x eager's error + {FLOOR_ULPS:g} ulp"
        return f"matches eager on {self.trials} random input(s) ({rule})"


def verify_against_eager(
    realized: Callable[..., Any],
    eager: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    trials: int = 3,
    seed: int = 1,
    agree: Callable[[Mismatch | None], Mismatch | None] | None = None,
) -> VerifyReport:
    """Check `realized` against `eager` on `trials` inputs: `inputs` first, then fresh
    random ones shaped like them (module doc).

    A RealizedPlan is checked by its own `verify` (eager is its exported program, also run
    in high precision), which falls back only the groups responsible for a mismatch;
    any other callable is compared with `eager`, an nn.Module run in high precision as
    the reference (else the fixed tolerance table decides).

    `agree`, on the ranks of a program with collectives: maps this rank's outcome of a
    trial (its mismatch, None: it matched) to the one every rank takes, so that a
    mismatch one rank sees stops the trials on every rank (each runs the same programs).
    """
    gen = torch.Generator().manual_seed(seed)
    name = str(model_dtype(eager, inputs)).removeprefix("torch.")
    reference = ""
    done = 0
    for t in range(trials):
        args = fresh_inputs(inputs, gen) if t else tuple(inputs)
        try:
            bad, reference = _check(realized, eager, args)
        except Exception as e:  # eager itself refuses random values (e.g. offsets that
            if t == 0:  # must be sorted): the trials on given inputs stand
                raise
            reference += f"; fresh inputs rejected by eager ({type(e).__name__})"
            break
        done += 1
        if agree is not None:
            bad = agree(bad)
        if bad is not None:
            return VerifyReport(done, bad, name, reference, _fallbacks(realized))
    return VerifyReport(done, None, name, reference, _fallbacks(realized))


def _check(
    realized: Callable[..., Any], eager: Callable[..., Any], args: tuple[Any, ...]
) -> tuple[Mismatch | None, str]:
    """One trial: the mismatch (None: agree) and what the plan was judged against."""
    if isinstance(realized, RealizedPlan):
        return realized.verify(args), realized.reference
    return check_callable(realized, eager, args)


def _fallbacks(realized: Any) -> dict[int, str]:
    if not isinstance(realized, RealizedPlan):
        return {}
    return {g: short_reason(why) for g, why in realized.fallbacks.items()}
