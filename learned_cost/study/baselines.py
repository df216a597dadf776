"""Baselines the learned correction must beat, on the same features and the same target.

Every baseline predicts ln(measured / analytical), like `CorrectionMLP`, so evaluation
treats them alike:
- `AnalyticalOnly`: predicts 0, i.e. the roofline as it is.
- `MeanBias`: one learned scale factor for every group (the "random baseline" of a learned
  component: if the MLP cannot beat a constant, it learned nothing about groups).
- `RidgeCorrection`: standardized features -> ridge regression.
- `GBTCorrection`: gradient-boosted trees (Huber loss).
- `TwinsOver`: ridge or gbt with a table of measured twins in front (learned_cost/twins.py),
  so that the MLP with twins is compared with the same lookup in front of a baseline.

scikit-learn is imported here and in `evaluate`, never by the modules a planning run
needs (features, mlp, corrected, online, persist).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.linear_model import Ridge
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from learned_cost.twins import TwinTable
from planner.errors import CostModelError


class _Baseline:
    """The estimator contract shared by the baselines (see mlp.CorrectionMLP)."""

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params: Any) -> _Baseline:
        for k, v in params.items():
            if k not in self.get_params():
                raise CostModelError(f"{type(self).__name__} has no hyper-parameter {k!r}")
            setattr(self, k, v)
        return self

    def _require_fit(self, attr: str) -> None:
        if not hasattr(self, attr):
            raise CostModelError(f"{type(self).__name__} is not fitted: call fit(X, y) first")

    @staticmethod
    def _check(X: np.ndarray, y: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise CostModelError(f"expected a 2-D feature matrix, got shape {X.shape}")
        if y is not None:
            y = np.asarray(y, dtype=np.float64).reshape(-1)
            if len(y) != len(X) or not np.isfinite(y).all():
                raise CostModelError("targets must be finite, one per row of X")
        return X, y


class AnalyticalOnly(_Baseline):
    """The roofline uncorrected: the log-ratio prediction is 0 for every group."""

    def __init__(self) -> None:
        pass

    def fit(self, X: np.ndarray, y: np.ndarray) -> AnalyticalOnly:
        X, _ = self._check(X, y)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        self._require_fit("n_features_in_")
        X, _ = self._check(X)
        return np.zeros(len(X))


class MeanBias(_Baseline):
    """analytical x exp(mean log-ratio of the training rows): one factor for all groups."""

    def __init__(self) -> None:
        pass

    def fit(self, X: np.ndarray, y: np.ndarray) -> MeanBias:
        X, y = self._check(X, y)
        assert y is not None
        self.bias_ = float(np.median(y))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        self._require_fit("bias_")
        X, _ = self._check(X)
        return np.full(len(X), self.bias_)


class RidgeCorrection(_Baseline):
    """Standardized features -> ridge regression on the log-ratio."""

    def __init__(self, alpha: float = 1.0, random_state: int = 0):
        self.alpha = alpha
        self.random_state = random_state

    def fit(self, X: np.ndarray, y: np.ndarray) -> RidgeCorrection:
        X, y = self._check(X, y)
        self.pipeline_: Pipeline = make_pipeline(
            StandardScaler(), Ridge(alpha=self.alpha, random_state=self.random_state)
        ).fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        self._require_fit("pipeline_")
        X, _ = self._check(X)
        return self.pipeline_.predict(X)


class GBTCorrection(_Baseline):
    """Gradient-boosted regression trees (Huber loss) on the log-ratio."""

    def __init__(
        self,
        n_estimators: int = 300,
        max_depth: int = 3,
        learning_rate: float = 0.05,
        subsample: float = 0.8,
        random_state: int = 0,
    ):
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.random_state = random_state

    def fit(self, X: np.ndarray, y: np.ndarray) -> GBTCorrection:
        X, y = self._check(X, y)
        self.model_ = GradientBoostingRegressor(
            loss="huber",
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            learning_rate=self.learning_rate,
            subsample=self.subsample,
            random_state=self.random_state,
        ).fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        self._require_fit("model_")
        X, _ = self._check(X)
        return self.model_.predict(X)


class TwinsOver(_Baseline):
    """A baseline (`base`: "ridge" or "gbt", with its default settings and `random_state`)
    with measured twins in front: a row whose feature vector the training rows hold gets
    their median log-ratio, the others the baseline's prediction."""

    BASES: Mapping[str, type[_Baseline]] = {"ridge": RidgeCorrection, "gbt": GBTCorrection}

    def __init__(self, base: str = "gbt", random_state: int = 0):
        self.base = base
        self.random_state = random_state

    def fit(self, X: np.ndarray, y: np.ndarray) -> TwinsOver:
        if self.base not in self.BASES:
            raise CostModelError(
                f"TwinsOver base must be one of {list(self.BASES)}, got {self.base!r}"
            )
        X, y = self._check(X, y)
        self.base_ = self.BASES[self.base](random_state=self.random_state).fit(X, y)
        self.twins_ = TwinTable.fit(X, y)
        return self

    @classmethod
    def of_fitted(cls, base: _Baseline, X: np.ndarray, y: np.ndarray) -> TwinsOver:
        """A fitted baseline, already fitted on (X, y), with the twins of those rows in
        front (what `fit` on those rows gives, without fitting the baseline again)."""
        name = next((k for k, v in cls.BASES.items() if isinstance(base, v)), None)
        if name is None:
            raise CostModelError(f"TwinsOver cannot stand in front of {type(base).__name__}")
        model = cls(name, getattr(base, "random_state", 0))
        model.base_ = base
        model.twins_ = TwinTable.fit(*cls._check(X, y))
        return model

    def predict(self, X: np.ndarray) -> np.ndarray:
        self._require_fit("twins_")
        X, _ = self._check(X)
        return self.twins_.answer(X, self.base_.predict(X))
