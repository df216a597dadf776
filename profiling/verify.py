"""Checking a realized plan against eager on fresh inputs, before its timings are trusted.

`planner.realize` already checks every plan on the capture's example inputs (and falls
back group by group); this is the measuring side's check: more trials on new random
values of the same shapes, with the same dtype-aware tolerance table (it lives in
planner.realize_check, because the runtime in `planner` needs it and may not import
profiling; it is re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from planner.realize_check import (
    TOLERANCES,
    Mismatch,
    Tolerance,
    compare_outputs,
    tolerance_for,
)

__all__ = [
    "TOLERANCES",
    "Mismatch",
    "Tolerance",
    "VerifyReport",
    "compare_outputs",
    "tolerance_for",
    "verify_against_eager",
]


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of `verify_against_eager`: trials run, the first mismatch (None = agree)."""

    trials: int
    mismatch: Mismatch | None
    dtype: str

    @property
    def ok(self) -> bool:
        return self.mismatch is None

    def __str__(self) -> str:
        tol = tolerance_for(self.dtype)
        if self.ok:
            return (
                f"matches eager on {self.trials} random input(s) "
                f"({self.dtype}: rtol {tol.rtol}, atol {tol.atol})"
            )
        return f"DISAGREES with eager: {self.mismatch}"


def _like(x: Any, gen: torch.Generator) -> Any:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    fresh = torch.randn(x.shape, generator=gen, dtype=torch.float32)
    return fresh.to(device=x.device, dtype=x.dtype)


def verify_against_eager(
    realized: Callable[..., Any],
    eager: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    trials: int = 3,
    seed: int = 1,
) -> VerifyReport:
    """Run `realized` and `eager` on `trials` fresh random inputs shaped like `inputs`."""
    gen = torch.Generator().manual_seed(seed)
    dtype = next(
        (str(x.dtype).removeprefix("torch.") for x in inputs if isinstance(x, torch.Tensor)),
        "float32",
    )
    for t in range(trials):
        args = tuple(_like(x, gen) for x in inputs) if t else tuple(inputs)
        with torch.no_grad():
            bad = compare_outputs(eager(*args), realized(*args))
        if bad is not None:
            return VerifyReport(t + 1, bad, dtype)
    return VerifyReport(trials, None, dtype)
