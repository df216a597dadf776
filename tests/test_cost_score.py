"""`fusion-plan cost score` (learned_cost/study/external.py): a saved model on rows of graphs
it was not trained on. Rows are fakes (tests/learned_fakes.py): latencies are the
roofline times a known factor, which the model learns from other graphs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from learned_fakes import GRAPHS, fake_rows

from learned_cost.features import design_matrix
from learned_cost.mlp import CorrectionMLP
from learned_cost.persist import save_model
from learned_cost.study.external import render_external, score_external
from planner.hardware import get_spec


def test_a_saved_model_scores_groups_and_plans_of_unseen_graphs(tmp_path):
    spec = get_spec("h100")
    train = [r for r in fake_rows(25, seed=4, graphs=GRAPHS[:5]) if r["kind"] == "group"]
    d = design_matrix(train, lambda _n: spec)
    model = CorrectionMLP(form="free", hidden=(32,), steps=400, n_members=1, dropout=0.0)
    path = tmp_path / "m.json"
    save_model(model.fit(d.X, d.y), path, spec=spec, data_files=("gone.parquet",))
    test = fake_rows(15, seed=5, graphs=GRAPHS[5:])
    data = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(test), data)
    rec = score_external(path, [str(data)], "h100", recapture=False)
    n_plans = sum(r["kind"] == "plan" for r in test)
    assert rec["n_plan_rows"] == n_plans and rec["plans_skipped"] == 0
    assert rec["plans"]["learned"]["n_plans"] == n_plans
    assert rec["architectures_in_training"] is None  # the training file is not here
    g = rec["groups"]
    assert g["learned"]["mape"] < g["analytical"]["mape"]
    p = rec["plans"]
    assert p["learned"]["plan_mape"] < p["analytical"]["plan_mape"]
    text = render_external({**rec, "command": "c"})
    assert "| learned |" in text and "Target (plan error <= 10%" in text
