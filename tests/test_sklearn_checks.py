"""scikit-learn's own estimator checks on CorrectionMLP (a small free-form configuration).

Every check scikit-learn yields for the model runs here: those that apply must pass, and
each one listed in NOT_APPLICABLE must still fail, so the list cannot outlive its reason.
The forms that read the analytical parts back ("roofline", "mixed") need the
FEATURE_NAMES columns, which the checks' random matrices do not have; they share the
validation and parameter handling checked here, and have their own tests in
test_learned_cost.py.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import estimator_checks_generator

from learned_cost.mlp import CorrectionMLP
from learned_cost.persist import save_model
from planner.errors import CostModelError, CostModelInputError, NotFittedCostModelError
from planner.hardware import get_spec

# Small enough for the default suite (all checks in a few seconds), big enough that
# check_regressors_train's R^2 > 0.5 on its 200-row dataset is earned, not waived.
SMALL = {"hidden": (16,), "steps": 150, "n_members": 1, "dropout": 0.0, "batch_size": 64}

NOT_APPLICABLE = {
    "check_estimators_unfitted": (
        "predict before fit raises NotFittedCostModelError, a ValueError and AttributeError "
        "as NotFittedError is, but not scikit-learn's own class: serving never imports it"
    ),
    "check_supervised_y_2d": (
        "a column-vector y is taken as 1-D (checked below), without scikit-learn's "
        "DataConversionWarning, whose class serving never imports"
    ),
    "check_dtype_object": (
        "a non-number in an object array raises CostModelInputError (a ValueError), not "
        "TypeError; object arrays of numbers fit (checked below)"
    ),
    "check_estimators_partial_fit_n_features": (
        "partial_fit refines a fitted model's last layer; it never starts an unfitted one"
    ),
    "check_n_features_in_after_fitting": (
        "its last part calls partial_fit on an unfitted model (see above); the wrong-width "
        "message of predict and score is checked below"
    ),
}


def _name(check) -> str:
    return (check.func if isinstance(check, functools.partial) else check).__name__


with warnings.catch_warnings():
    # it does not inherit sklearn.base.BaseEstimator: serving never imports scikit-learn
    warnings.filterwarnings("ignore", "Estimator CorrectionMLP does not inherit")
    CHECKS = list(estimator_checks_generator(CorrectionMLP(**SMALL)))


@pytest.mark.parametrize(("est", "check"), CHECKS, ids=[_name(c) for _, c in CHECKS])
def test_sklearn_estimator_check(est, check):
    name = _name(check)
    if name in NOT_APPLICABLE:
        with pytest.raises(Exception):  # noqa: B017 - any failure: the reason is in the list
            check(est)
        return
    try:
        check(est)
    except Exception as e:
        if type(e).__name__ == "SkipTest":  # e.g. pandas or array-API not installed
            pytest.skip(str(e))
        raise


def test_not_applicable_names_only_checks_that_run():
    assert set(NOT_APPLICABLE) <= {_name(c) for _, c in CHECKS}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 4))
    return X, X @ np.array([0.5, -0.2, 0.1, 0.0]) + 0.05 * rng.normal(size=40)


def test_what_the_waived_checks_would_have_asked(data):
    X, y = data
    est = CorrectionMLP(**SMALL)
    with pytest.raises(NotFittedCostModelError) as info:
        est.predict(X)
    assert isinstance(info.value, ValueError) and isinstance(info.value, AttributeError)
    est.fit(X, y)
    column = clone(est).fit(X, y[:, None])
    np.testing.assert_array_equal(column.predict(X), est.predict(X))
    objects = clone(est).fit(X.astype(object), y)
    np.testing.assert_array_equal(objects.predict(X), est.predict(X))
    for method in (est.predict, lambda X: est.score(X, y)):
        with pytest.raises(CostModelInputError, match=r"X has 1 features, but .* expecting 4"):
            method(X[:, :1])


def test_the_schema_forms_need_the_schema_columns(data):
    X, y = data
    for form in ("roofline", "mixed"):
        with pytest.raises(CostModelInputError, match="FEATURE_NAMES"):
            CorrectionMLP(**SMALL, form=form).fit(X, y)


def test_a_model_fitted_off_the_schema_is_not_saved(data, tmp_path):
    X, y = data
    model = CorrectionMLP(**SMALL).fit(X, y)
    with pytest.raises(CostModelError, match="fitted on 4 columns"):
        save_model(model, tmp_path / "m", spec=get_spec("h100"))
    assert not list(tmp_path.iterdir())
