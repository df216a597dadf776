"""Learned-cost plots are drawn from saved points, and the check ties them to the model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from learned_cost.study import plots
from learned_cost.study.evaluate import group_metrics


def _split(seed: int = 0) -> SimpleNamespace:
    """What plots read of a cross-validated split: measured and predicted seconds per row,
    families, and each model's held-out scores."""
    rng = np.random.default_rng(seed)
    measured = rng.uniform(1e-5, 1e-3, 60)
    families = np.array(["a", "b", "c"] * 20, dtype=object)
    predicted = {
        "analytical": measured * rng.uniform(0.5, 2.0, 60),
        "mlp-free": measured * rng.uniform(0.9, 1.1, 60),
    }
    scores = {n: group_metrics(p, measured, np.zeros(60)) for n, p in predicted.items()}
    cv = SimpleNamespace(
        design=SimpleNamespace(measured_s=measured, groups=families),
        oof_log_ratio=dict.fromkeys(predicted),
        predicted_s=lambda name: predicted[name],
    )
    return SimpleNamespace(
        split="family", cv=cv, score=lambda name: SimpleNamespace(groups=scores[name])
    )


def _meta(sr: SimpleNamespace) -> dict:
    return {
        "metrics": {
            "splits": {
                "family": {
                    "scores": [
                        {"name": n, "groups": {"mape": sr.score(n).groups.mape,
                                               "kendall_tau": sr.score(n).groups.kendall_tau}}
                        for n in sr.cv.oof_log_ratio
                    ]
                }
            }
        }
    }  # fmt: skip


@pytest.fixture
def drawn(tmp_path):
    sr = _split()
    (tmp_path / "m.json").write_text(json.dumps(_meta(sr)))
    png = tmp_path / "plot.png"
    plots.write_points(plots.make_points(sr, "h100", model_file="m.json"), png)
    plots.render_png(png)
    return tmp_path, sr


def test_a_plot_drawn_from_its_points_agrees_with_its_model(drawn):
    root, _ = drawn
    assert plots.points_path(root / "plot.png").is_file()
    assert plots.problems("plot.png", root) == []


def test_changed_points_are_found(drawn):
    root, _ = drawn
    src = plots.points_path(root / "plot.png")
    pts = json.loads(src.read_text())
    pts["panels"][1]["predicted_us"] = [2 * v for v in pts["panels"][1]["predicted_us"]]
    src.write_text(json.dumps(pts))
    found = plots.problems("plot.png", root)
    assert any("was not drawn from" in p for p in found)
    assert any("mlp-free do not give its title's figures" in p for p in found)
    plots.render_png(root / "plot.png")  # drawn again: only the figures are still wrong
    assert [p for p in plots.problems("plot.png", root) if "drawn" in p] == []


def test_a_title_unlike_the_models_table_is_found(drawn):
    root, sr = drawn
    meta = _meta(sr)
    meta["metrics"]["splits"]["family"]["scores"][0]["groups"]["mape"] += 0.01
    (root / "m.json").write_text(json.dumps(meta))
    (found,) = plots.problems("plot.png", root)
    assert "analytical's title differs from m.json's held-out-by-family table" in found


def test_a_plot_without_points_is_reported(tmp_path):
    (tmp_path / "old.png").write_bytes(b"")
    assert plots.problems("old.png", tmp_path) == ["old.png has no saved points (old.points.json)"]
