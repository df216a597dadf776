"""Adapting a trained correction to another device (learned_cost/adapt.py) and the study of
error against adaptation rows (learned_cost/study/adapt_curve.py).

Rows are fakes (real zoo groups, made-up latencies: tests/learned_fakes.py): the "target
device" runs every group a known factor slower than the source, so what an adaptation
must recover is known."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from learned_fakes import GRAPHS, fake_rows

from learned_cost.adapt import AdaptConfig, adapt_mlp, adapt_saved, target_design
from learned_cost.corrected import CorrectedModel, load_corrected
from learned_cost.features import design_matrix
from learned_cost.mlp import CorrectionMLP
from learned_cost.persist import load_model, save_model
from learned_cost.study.adapt_curve import CurveConfig, adaptation_order, render_curve, run_curve
from planner.errors import CostModelError
from planner.hardware import get_spec

SLOWER = math.log(1.7)  # the target runs every group 1.7x slower than the fakes say


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A small mixed MLP trained on h100 fakes, saved (the adapt commands load a file)."""
    rows = fake_rows(20, device="h100", seed=1, with_plans=False)
    d = design_matrix(rows, lambda _n: get_spec("h100"))
    model = CorrectionMLP(
        form="mixed", hidden=(16,), steps=150, n_members=1, dropout=0.0, twins=True
    ).fit(d.X, d.y)
    path = tmp_path_factory.mktemp("src") / "h100.json"
    meta = save_model(model, path, spec=get_spec("h100"), n_rows=len(d), command="test")
    return model, meta, path


def target_rows(slower: float = SLOWER, seed: int = 2) -> list[dict]:
    rows = fake_rows(12, device="h200", seed=seed, with_plans=False)
    for r in rows:
        r["measured_median_s"] *= math.exp(slower)
    return rows


def test_bias_recovers_a_uniform_slowdown_and_leaves_the_source_alone(source):
    model, _, _ = source
    before = [p.detach().clone() for n in model.nets_ for p in n.parameters()]
    d = target_design(target_rows(), get_spec("h200"))
    fast = target_design(target_rows(slower=0.0), get_spec("h200"))
    a = adapt_mlp(model, d.X, d.y, AdaptConfig(method="bias", twins=False))
    b = adapt_mlp(model, fast.X, fast.y, AdaptConfig(method="bias", twins=False))
    assert a.bias - b.bias == pytest.approx(SLOWER, abs=1e-9)
    after = [p for n in model.nets_ for p in n.parameters()]
    assert all(np.array_equal(x.numpy(), y.detach().numpy()) for x, y in zip(before, after))
    assert model.twins and hasattr(model, "twins_")  # the source keeps its own table
    none = adapt_mlp(model, d.X, d.y, AdaptConfig(method="none"))
    assert none.bias == 0.0 and not hasattr(none.mlp, "twins_")  # another device's table


def test_finetune_fits_a_shift_that_depends_on_the_group(source):
    model, _, _ = source
    rows = target_rows(slower=0.0)
    spec = get_spec("h200")
    for r in rows:  # memory-heavy groups slow down more: no single bias explains it
        r["measured_median_s"] *= 1.0 + 3.0 * (r["desc_n_kernels"] > 2)
    d = target_design(rows, spec)

    def mape(a) -> float:
        pred = d.analytical_s * np.exp(a.predict(d.X))
        return float(np.mean(np.abs(pred - d.measured_s) / d.measured_s))

    bias = adapt_mlp(model, d.X, d.y, AdaptConfig(method="bias", twins=False))
    tuned = adapt_mlp(model, d.X, d.y, AdaptConfig(method="finetune", steps=300, twins=False))
    assert mape(tuned) < mape(bias)
    twins = adapt_mlp(model, d.X, d.y, AdaptConfig(method="finetune", steps=1))
    # with twins an adaptation row measured once is answered by its own measurement,
    # whatever the networks say
    _, first, counts = np.unique(d.X.round(6), axis=0, return_index=True, return_counts=True)
    once = first[counts == 1]
    assert len(once) > 10
    assert np.allclose(twins.predict(d.X[once]), d.y[once], atol=1e-6)


def test_adapt_config_refuses_unknown_methods():
    with pytest.raises(CostModelError, match="one of"):
        AdaptConfig(method="retrain")
    with pytest.raises(CostModelError, match="lr"):
        AdaptConfig(lr=0.0)


def test_an_adapted_model_saves_and_loads_as_the_target_devices(source, tmp_path):
    model, meta, _ = source
    rows = target_rows()
    spec = get_spec("h200")
    out = tmp_path / "h200.json"
    new, summary = adapt_saved(
        model, meta, rows, spec, AdaptConfig(method="finetune", steps=20), out
    )
    assert new.device == "h200" and summary["adapted_from"]["model_id"] == meta.model_id
    assert (
        summary["adaptation"]["in_sample_mape_adapted"]
        < summary["adaptation"]["in_sample_mape_source"]
    )
    loaded = load_corrected(out, "h200")
    assert isinstance(loaded, CorrectedModel)
    assert loaded.online.bias == pytest.approx(summary["adaptation"]["bias"])
    mlp, _ = load_model(out, device="h200")
    d = target_design(rows, spec)
    got = mlp.predict(d.X) + loaded.online.bias
    _, first, counts = np.unique(d.X.round(6), axis=0, return_index=True, return_counts=True)
    once = first[counts == 1]  # a group measured once is answered by its measurement
    assert len(once) > 10
    assert np.allclose(np.exp(got[once]) * d.analytical_s[once], d.measured_s[once], rtol=1e-4)
    from cli.commands.cost import render_report

    text = render_report([(str(out), new)])
    assert f"## h200 ({new.model_id}), adapted from h100 ({meta.model_id})" in text


def test_adaptation_order_takes_whole_graphs_from_the_pool_only():
    groups = np.array(list("aabbbccdd"), dtype=object)
    pool = np.array([0, 1, 2, 3, 4, 7, 8])  # graph c is held out
    order = adaptation_order(pool, groups, np.random.default_rng(0), "graphs")
    assert sorted(order.tolist()) == pool.tolist()
    runs = [groups[i] for i in order]
    assert len([k for k, prev in zip(runs, [None, *runs]) if k != prev]) == 3  # one run each
    rows = adaptation_order(pool, groups, np.random.default_rng(0), "rows")
    assert sorted(rows.tolist()) == pool.tolist()


def test_the_study_scores_every_row_once_per_size(source, tmp_path):
    model, meta, _ = source
    rows = target_rows()
    # the source "was trained on" the first three graphs: the rest are new to it
    trained = tmp_path / "source.parquet"
    pq.write_table(pa.Table.from_pylist(fake_rows(1, graphs=GRAPHS[:3])), trained)
    meta = dataclasses.replace(meta, data_files=(str(trained),))
    cfg = CurveConfig(
        sizes=(0, 15),
        seeds=(0,),
        n_splits=2,
        methods=("adapt-none", "adapt-bias", "scratch-gbt", "source-figures"),
        gbt_params={"n_estimators": 10},
    )
    study = run_curve(model, meta, rows, get_spec("h200"), cfg)
    s = study["summary"]
    assert set(s) == {m + t for m in cfg.methods for t in ("", "+twins")}
    assert study["seeds"][0]["rows_used"] == {"0": 0.0, "15": 15.0}
    # no rows: bias is the source as it is; 15 rows: a 1.7x slowdown is mostly corrected
    assert s["adapt-bias"]["0"]["mape"] == s["adapt-none"]["0"]["mape"]
    assert s["adapt-bias"]["15"]["mape"]["mean"] < s["adapt-none"]["15"]["mape"]["mean"]
    assert s["adapt-none"]["0"]["mape"]["mean"] > 0.3  # the slowdown is really there
    study["reference"] = {"model": "m", "study": "s.json", "mape": {"graph": 0.1}}
    text = render_curve(json.loads(json.dumps(study)))
    assert "| adapt-bias | " in text and "| 15 rows |" in text
    assert 0 < study["seen_share"] < 1
    fresh = study["summary_new_graphs"]["adapt-none+twins"]["0"]["mape"]["mean"]
    assert fresh != s["adapt-none+twins"]["0"]["mape"]["mean"]  # scored on fewer rows
    assert "graphs the source model never saw" in text


def test_cli_adapt_refuses_rows_of_another_device(source, capsys):
    from cli.main import main

    _, _, path = source
    rows = fake_rows(2, device="h100", with_plans=False)
    data = path.parent / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    code = main(
        [
            "cost",
            "adapt",
            "--model",
            str(path),
            "--data",
            str(data),
            "--device",
            "h200",
            "--stored-descriptors",
        ]
    )
    assert code != 0
    err = capsys.readouterr().err
    assert "no usable group rows of device 'h200'" in err and "h100" in err
