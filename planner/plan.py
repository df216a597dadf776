"""Deprecated location: the module moved to `planner.plans.plan`. Importing this name
still works and warns."""

import warnings

import planner.plans.plan as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})
warnings.warn(
    "planner.plan moved to planner.plans.plan; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
