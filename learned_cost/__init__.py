"""Cost models: the analytical roofline and its learned correction (docs/formulas.md §9, §11).

The public surface below needs only torch, numpy and pyarrow. The modules that compare
models and write reports (`learned_cost.study.baselines`, `learned_cost.study.evaluate`,
`learned_cost.study.train`, `learned_cost.study.heldout`, `learned_cost.study.heldout_report`) also import
scikit-learn, scipy and matplotlib; import them by name.
"""

from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import (
    CorrectedModel,
    CostModelFallbackWarning,
    CpuTransferWarning,
    default_realization,
    load_corrected,
)
from learned_cost.data import Profiles, load_profiles
from learned_cost.features import (
    FEATURE_NAMES,
    FEATURES,
    SCHEMA_HASH,
    AnalyticalParts,
    analytical_parts,
    design_matrix,
    feature_vector,
)
from learned_cost.mlp import CorrectionMLP
from learned_cost.online import Observation, OnlineBias, UpdateReport
from learned_cost.persist import ModelMeta, load_model, read_meta, save_model

__all__ = [
    "FEATURES",
    "FEATURE_NAMES",
    "SCHEMA_HASH",
    "AnalyticalModel",
    "AnalyticalParts",
    "CorrectedModel",
    "CorrectionMLP",
    "CostModelFallbackWarning",
    "CpuTransferWarning",
    "ModelMeta",
    "Observation",
    "OnlineBias",
    "Profiles",
    "UpdateReport",
    "analytical_parts",
    "default_realization",
    "design_matrix",
    "feature_vector",
    "load_corrected",
    "load_model",
    "load_profiles",
    "read_meta",
    "save_model",
]
