"""The runtime: a `torch.compile` backend that serves each shape bucket's tuned plan.

from planner.runtime import fusion_planner_backend
compiled = torch.compile(model, backend=fusion_planner_backend("plans.sqlite"))
"""

from planner.runtime.backend import (
    FusionPlannerBackend,
    PlannerRuntimeWarning,
    RuntimeStats,
    fusion_planner_backend,
)

__all__ = [
    "FusionPlannerBackend",
    "PlannerRuntimeWarning",
    "RuntimeStats",
    "fusion_planner_backend",
]
