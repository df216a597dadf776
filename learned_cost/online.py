"""Online refinement of a trained correction from new measurements (docs/formulas.md §13).

The adaptive rule theta_{t+1} = theta_t + eta * (R_observed - R_predicted), applied
to the correction's log-bias: every new measurement m of a unit the model predicted as p
moves the bias b by
    b <- b + alpha * (ln m - ln p),        p already including b,
i.e. an exponentially weighted mean of the log residuals with weight alpha. It is cheap,
needs no retraining, and absorbs what changes between training and tuning (another torch
build, another host, a warmer or cooler device). Optionally, `last_layer_steps` gradient
steps on the MLP's output layer refine the per-group shape of the correction from
measured groups too (`CorrectionMLP.partial_fit`).

Each device has its own model (and so its own bias): `CorrectedModel.update` skips rows
measured on another device. The state is two numbers and persists in the model's JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from planner.errors import CostModelError
from planner.ir.graph import OpGraph


@dataclass(frozen=True)
class Observation:
    """A measured unit the tune loop has: a whole plan (or one group) of a graph.

    `groups` are the node-index groups of the plan (one group for a group measurement);
    `measured_s` the measured median latency of running them all.
    """

    graph: OpGraph
    groups: tuple[frozenset[int], ...]
    measured_s: float
    device: str | None = None  # spec name; None means the model's own device

    @classmethod
    def of_plan(
        cls, graph: OpGraph, groups: Iterable[Iterable[int]], measured_s: float, **kw: Any
    ) -> Observation:
        return cls(graph, tuple(frozenset(g) for g in groups), float(measured_s), **kw)


@dataclass(frozen=True)
class UpdateReport:
    """What one `update` call did."""

    used: int
    skipped: int
    bias_before: float
    bias_after: float
    mean_abs_residual: float  # |ln m - ln p| before the update, over the used rows
    version: str


class OnlineBias:
    """An exponentially weighted log-bias, in nats (exp(bias) multiplies every prediction).

    Hyper-parameters: `alpha` (weight of each new observation: 0.2 forgets an old one in
    ~5 updates), `last_layer_steps` and `lr` (gradient steps on the MLP's last layer per
    update of group rows; 0 turns that off), `max_abs_bias` (a safety bound: one wild
    measurement cannot rescale every prediction by more than exp(max_abs_bias)).
    Not thread-safe on its own; `CorrectedModel` serializes updates.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.2,
        last_layer_steps: int = 0,
        lr: float = 1e-3,
        max_abs_bias: float = 3.0,
    ):
        if not 0.0 < alpha <= 1.0:
            raise CostModelError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.last_layer_steps = last_layer_steps
        self.lr = lr
        self.max_abs_bias = max_abs_bias
        self.bias = 0.0
        self.n_observations = 0

    def observe(self, residual: float) -> None:
        """One residual ln(measured / predicted-with-bias)."""
        if not math.isfinite(residual):
            return
        b = self.bias + self.alpha * residual
        self.bias = max(-self.max_abs_bias, min(self.max_abs_bias, b))
        self.n_observations += 1

    def state(self) -> dict[str, Any]:
        return {
            "bias": self.bias,
            "n_observations": self.n_observations,
            "alpha": self.alpha,
            "last_layer_steps": self.last_layer_steps,
            "lr": self.lr,
            "max_abs_bias": self.max_abs_bias,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> OnlineBias:
        state = state or {}
        ob = cls(
            alpha=float(state.get("alpha", 0.2)),
            last_layer_steps=int(state.get("last_layer_steps", 0)),
            lr=float(state.get("lr", 1e-3)),
            max_abs_bias=float(state.get("max_abs_bias", 3.0)),
        )
        ob.bias = float(state.get("bias", 0.0))
        ob.n_observations = int(state.get("n_observations", 0))
        return ob
