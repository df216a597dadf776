"""Measured twins (learned_cost/twins.py): a group the training rows timed is looked up."""

from __future__ import annotations

import numpy as np
import pytest
from learned_fakes import fake_rows

from learned_cost.corrected import load_corrected
from learned_cost.features import design_matrix
from learned_cost.mlp import CorrectionMLP
from learned_cost.persist import load_model, paths_for, save_model
from learned_cost.study.baselines import GBTCorrection, TwinsOver
from learned_cost.study.evaluate import MODELS, cross_validate
from learned_cost.twins import TwinTable
from planner.errors import CostModelError
from planner.hardware import get_spec

FAST = {"steps": 300, "n_members": 1}


@pytest.fixture(scope="module")
def spec():
    return get_spec("h100")


@pytest.fixture(scope="module")
def design(spec):
    return design_matrix(fake_rows(20, seed=2, with_plans=False), lambda _n: spec)


@pytest.fixture(scope="module")
def twinned(design):
    """The design with its first 10 rows measured twice more, at other latencies: every
    one of those feature vectors has three measurements."""
    X = np.vstack([design.X, design.X[:10], design.X[:10]])
    y = np.concatenate([design.y, design.y[:10] + 0.3, design.y[:10] - 0.1])
    return X, y


def _medians(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each row's expected answer: the median of y over the rows with its features."""
    return np.array([np.median(y[(x == X).all(axis=1)]) for x in X])


def test_twin_table_answers_the_median_of_exact_twins_only(twinned):
    X, y = twinned
    table = TwinTable.fit(X, y)
    assert len(table) == len(np.unique(X, axis=0))
    values, hit = table.lookup(X)
    assert hit.all()
    np.testing.assert_allclose(values, _medians(X, y))
    assert table.counts[table.lookup(X[:1])[1].nonzero()[0]].size == 1
    assert sorted(table.counts.tolist()).count(3) >= 10
    # float noise far below a feature's resolution still keys alike; a real change does not
    assert table.lookup(X[:5] + 1e-10)[1].all()
    moved = X[:5].copy()
    moved[:, 0] += 0.01
    values, hit = table.lookup(moved)
    assert not hit.any() and np.isnan(values).all()
    again = TwinTable.from_arrays(table.arrays())
    np.testing.assert_array_equal(again.lookup(X)[0], table.lookup(X)[0])
    with pytest.raises(CostModelError, match="feature rows for"):
        TwinTable.fit(X, y[:-1])


def test_mlp_with_twins_answers_measured_groups_and_asks_its_networks_otherwise(
    twinned, design, spec, tmp_path
):
    X, y = twinned
    plain = CorrectionMLP(**FAST, random_state=1).fit(X, y)
    model = CorrectionMLP(**FAST, twins=True, random_state=1).fit(X, y)
    np.testing.assert_allclose(model.predict(X), _medians(X, y))
    # groups it never measured: the same networks, the same answer as without twins
    unseen = design_matrix(
        fake_rows(5, seed=3, with_plans=False, graphs=(("zoo:mlp", "B=8,D=96,HID=160,L=1"),)),
        lambda _n: spec,
    ).X
    assert not model.twins_.lookup(unseen)[1].any()
    np.testing.assert_array_equal(model.predict(unseen), plain.predict(unseen))
    # a fitted model given its rows' twins afterwards is the model fitted with them
    built = plain.with_twins(X, y)
    assert built.get_params() == model.get_params() and not hasattr(plain, "twins_")
    np.testing.assert_array_equal(built.predict(X), model.predict(X))
    # the table travels in the .npz (plain arrays), and the corrected model uses it
    save_model(model, tmp_path / "t.json", spec=spec)
    with np.load(paths_for(tmp_path / "t.json")[1], allow_pickle=False) as z:
        assert {"twins.keys", "twins.values", "twins.counts"} <= set(z.files)
    loaded, meta = load_model(tmp_path / "t.json", device="h100")
    assert meta.params["twins"] is True
    np.testing.assert_allclose(loaded.predict(X), model.predict(X), rtol=1e-9)
    assert load_corrected(tmp_path / "t.json", device="h100").mlp.twins_ is not None
    # a refit without twins forgets the table
    model.set_params(twins=False).fit(X, y)
    assert not hasattr(model, "twins_")


def test_mixed_model_keeps_the_twins_of_its_parts(twinned):
    X, y = twinned
    parts = [
        CorrectionMLP(form=f, **FAST, twins=True, random_state=2).fit(X, y)
        for f in ("free", "roofline")
    ]
    mixed = CorrectionMLP.mixed_of(*parts)
    assert mixed.twins
    np.testing.assert_allclose(mixed.predict(X), _medians(X, y))


def test_twins_over_a_baseline(twinned):
    X, y = twinned
    gbt = GBTCorrection(n_estimators=20).fit(X, y)
    over = TwinsOver.of_fitted(gbt, X, y)
    assert over.get_params() == TwinsOver("gbt").get_params()
    np.testing.assert_allclose(over.predict(X), _medians(X, y))
    with pytest.raises(CostModelError, match="base must be one of"):
        TwinsOver("xgb").fit(X, y)


def test_cross_validation_answers_held_out_groups_from_the_training_folds_only(spec):
    """Split by graph, a held-out group gets a twin's median only where another graph's
    rows (in the training folds) measured the same features."""
    rows = fake_rows(15, seed=4, with_plans=False)
    # the same groups measured again in another graph (as two families share a block)
    rows += [
        {**r, "graph_key": "another-graph", "measured_median_s": 1.1 * r["measured_median_s"]}
        for r in rows[:12]
    ]
    names = ("gbt", "gbt+twins", "mlp-free", "mlp-free+twins")
    models = [m for m in MODELS if m[0] in names]
    overrides = {"gbt": {"n_estimators": 20}, "mlp-free": FAST}  # +twins rows follow their base
    cv = cross_validate(
        rows, lambda _n: spec, split="graph_key", n_splits=3, models=models, overrides=overrides
    )
    X, y = cv.design.X, cv.design.y
    n_answered = 0
    for k, fitted in enumerate(cv.fitted):
        twinned = fitted["mlp-free+twins"]
        assert twinned.get_params() == {**fitted["mlp-free"].get_params(), "twins": True}
        train, test = cv.fold != k, np.flatnonzero(cv.fold == k)
        for base in ("gbt", "mlp-free"):
            for i in test:
                same = train & (X[i] == X).all(axis=1)
                want = np.median(y[same]) if same.any() else cv.oof_log_ratio[base][i]
                assert cv.oof_log_ratio[f"{base}+twins"][i] == pytest.approx(want)
                n_answered += int(same.any())
    assert n_answered > 0  # some held-out group had a twin in the training folds
