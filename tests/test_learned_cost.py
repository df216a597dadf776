"""The learned correction: estimator contract, persistence, fallback, CostModel, online update.

Rows here are fakes (real zoo groups, made-up latencies: tests/learned_fakes.py); the
tests on the committed real datasets are in test_learned_eval.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from learned_fakes import fake_rows, graph
from sklearn.base import clone

from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import (
    CorrectedModel,
    CostModelFallbackWarning,
    CpuTransferWarning,
    load_corrected,
)
from learned_cost.features import FEATURE_NAMES, FEATURES_V5, design_matrix, feature_vector
from learned_cost.mlp import CorrectionMLP
from learned_cost.online import Observation, OnlineBias
from learned_cost.persist import load_model, paths_for, read_meta, save_model
from learned_cost.study.evaluate import MODELS
from planner.cost import CostModel, GroupCost
from planner.errors import CostModelError
from planner.features import group_descriptor
from planner.hardware import MeasuredPeaks, device_fingerprint, get_spec
from planner.ir.graph import Category

REPO = Path(__file__).resolve().parents[1]
FAST = {"steps": 400, "n_members": 1}  # one network: the ensemble has its own tests


@pytest.fixture(scope="module")
def spec():
    return get_spec("h100")


@pytest.fixture(scope="module")
def rows():
    return [r for r in fake_rows(25, seed=1, with_plans=False)]


@pytest.fixture(scope="module")
def design(rows, spec):
    return design_matrix(rows, lambda _n: spec)


@pytest.fixture(scope="module")
def fitted(design):
    return CorrectionMLP(**FAST).fit(design.X, design.y)


def test_anchor_feature_reads_the_gemm_reduction_dimension(spec):
    """anchor_flops_per_out is 2K (+1 for the bias add) for a linear layer of K inputs:
    what tells a skinny GEMM, far from the tensor-core peak, from a square one."""
    g = graph("zoo:mlp", "B=32,D=256,HID=512,L=2")
    first = next(i for i, n in enumerate(g.nodes) if n.op == "linear")
    x = feature_vector(group_descriptor(g, frozenset({first})), dtype="float32", spec=spec)
    per_out = 10 ** x[FEATURE_NAMES.index("anchor_flops_per_out")] - 1
    assert 2 * 256 <= per_out <= 2 * 256 + 2


@pytest.mark.parametrize(("hid_tiles", "efficiency"), [(132, 1.0), (133, 133 / 264)])
def test_wave_features_count_gemm_tiles_over_the_sms(spec, hid_tiles, efficiency):
    """A GEMM of 128 x (128 * tiles) outputs fills tiles/132 waves of an H100's SMs; one
    tile past a full wave leaves most of the second wave idle. A CPU has no waves."""
    g = graph("zoo:mlp", f"B=128,D=64,HID={128 * hid_tiles},L=1")
    first = next(i for i, n in enumerate(g.nodes) if n.op == "linear")
    desc = group_descriptor(g, frozenset({first}))
    x = feature_vector(desc, dtype="bfloat16", spec=spec)
    assert 10 ** x[FEATURE_NAMES.index("anchor_waves")] == pytest.approx(hid_tiles / 132)
    assert x[FEATURE_NAMES.index("wave_efficiency")] == pytest.approx(efficiency)
    cpu = feature_vector(desc, dtype="bfloat16", spec=get_spec("cpu"))
    assert cpu[FEATURE_NAMES.index("anchor_waves")] == 0.0
    assert cpu[FEATURE_NAMES.index("wave_efficiency")] == 1.0


@pytest.mark.parametrize(
    ("model", "shape", "mnk"),
    [
        ("zoo:mlp", "B=64,D=1024,HID=4096,L=2", (64, 4096, 1024)),
        # a convolution as its implicit GEMM: M = B*H*W, N = C_out, K = C_in*3*3
        ("zoo:conv-bn-relu-maxpool", "B=2,CIN=3,C=32,HW=16", (2 * 16 * 16, 32, 27)),
    ],
)
def test_the_largest_anchor_is_described_as_a_gemm(spec, model, shape, mnk):
    g = graph(model, shape)
    first = next(i for i, n in enumerate(g.nodes) if n.category.value == "compute")
    desc = group_descriptor(g, frozenset({first}))
    assert (desc["anchor_m"], desc["anchor_n"], desc["anchor_k"]) == mnk
    x = feature_vector(desc, dtype="bfloat16", spec=spec)
    assert x[FEATURE_NAMES.index("anchor_n_fill")] == pytest.approx(min(mnk[1], 128) / 128)
    misaligned = mnk[1] % 8 != 0 or mnk[2] % 8 != 0
    assert x[FEATURE_NAMES.index("anchor_misaligned")] == float(misaligned)


def test_batched_attention_gemms_count_tiles_per_batch_entry_and_reductions(spec):
    """Q @ K^T of a (B, H, S, D) block runs B*H GEMMs of S x S: its 128x128 tiles are
    counted per batch entry; the softmax reduces the last dim, S long, in B*H*S rows; an
    eager group launches one kernel per op that is not a view."""
    g = graph("zoo:gpt2-block", "B=2,S=128,D=256,H=4", "bfloat16")
    qk = next(n for n in g.nodes if n.op in ("matmul", "bmm") and n.category.value == "compute")
    sm = next(n for n in g.nodes if n.category is Category.SOFTMAX)
    desc = group_descriptor(g, frozenset({qk.index, sm.index}))
    assert desc["anchor_tiles"] == str(2 * 4 * 1 * 1) and desc["anchor_batch"] == 2 * 4
    assert (desc["red_len_max"], desc["red_rows_min"]) == (128, 2 * 4 * 128)
    x = feature_vector(desc, dtype="bfloat16", spec=spec)
    assert 10 ** x[FEATURE_NAMES.index("gemm_tiles_over_sms")] - 1 == pytest.approx(8 / 132)
    assert x[FEATURE_NAMES.index("gemm_wave_eff_min")] == pytest.approx(8 / 132)
    eager = feature_vector(desc, dtype="bfloat16", spec=spec, realization="eager")
    assert 10 ** eager[FEATURE_NAMES.index("est_kernels")] - 1 == pytest.approx(2)
    assert 10 ** x[FEATURE_NAMES.index("est_kernels")] - 1 == pytest.approx(2)  # GEMM + softmax


def test_a_model_of_the_earlier_feature_schema_is_fed_its_own_columns(spec, tmp_path):
    """The committed models were trained on schema 5: they load, read its 59 features (the
    first columns of today's), cost groups, and save again (adapted, say) as schema 5."""
    names5 = tuple(n for n, _, _ in FEATURES_V5)
    assert FEATURE_NAMES[: len(names5)] == names5
    cm = load_corrected(REPO / "learned_cost" / "models" / "h100.json", "h100")
    assert isinstance(cm, CorrectedModel) and cm.feature_names == names5
    g = graph("zoo:mlp", "B=32,D=256,HID=512,L=2")
    (cost,) = cm.group_costs(g, [frozenset({next(n.index for n in g.nodes if n.op == "linear")})])
    assert math.isfinite(cost.latency_s) and cost.latency_s > 0
    meta = save_model(cm.mlp, tmp_path / "v5.json", spec=spec)
    assert (meta.feature_schema_version, len(meta.feature_names)) == (5, len(names5))
    assert load_model(tmp_path / "v5.json")[0].feature_names_ == names5


# ---- estimator contract ------------------------------------------------------------------------
ESTIMATORS = [(name, make) for name, make, _ in MODELS]


@pytest.mark.parametrize(("name", "make"), ESTIMATORS, ids=[n for n, _ in ESTIMATORS])
def test_estimator_contract(name, make, design):
    est = make(0)
    if isinstance(est, CorrectionMLP):
        est.set_params(**FAST)
    # __init__ stores hyper-parameters only: nothing learned, nothing ending in "_".
    assert not [k for k in vars(est) if k.endswith("_")]
    copy = clone(est)  # scikit-learn can rebuild it from get_params alone
    assert copy.get_params() == est.get_params()
    with pytest.raises(CostModelError, match="not fitted"):
        est.predict(design.X)
    assert est.fit(design.X, design.y) is est
    learned = [k for k in vars(est) if k.endswith("_")]
    assert learned, f"{name} keeps no fitted state ending in '_'"
    assert not [k for k in vars(clone(est)) if k.endswith("_")]  # a clone is unfitted
    pred = est.predict(design.X)
    assert pred.shape == (len(design),) and np.isfinite(pred).all()


def test_mlp_is_a_scikit_learn_regressor(design):
    """scikit-learn's own tools take the MLP as a regressor: tags, fitted check, and
    cross-validation with the default (R^2) scoring through `score`."""
    from sklearn.base import is_regressor
    from sklearn.model_selection import cross_val_score
    from sklearn.utils.validation import check_is_fitted

    est = CorrectionMLP(**FAST)
    assert is_regressor(est)
    with pytest.raises(Exception, match="not fitted"):
        check_is_fitted(est)
    scores = cross_val_score(est, design.X, design.y, cv=2)
    assert scores.shape == (2,) and np.isfinite(scores).all()
    est.fit(design.X, design.y)
    check_is_fitted(est)
    assert est.score(design.X, design.y) > 0.5  # it fits its own training rows


def test_mlp_is_reproducible_and_refit_replaces(design):
    a = CorrectionMLP(**FAST, random_state=3).fit(design.X, design.y).predict(design.X)
    b = CorrectionMLP(**FAST, random_state=3).fit(design.X, design.y).predict(design.X)
    c = CorrectionMLP(**FAST, random_state=4).fit(design.X, design.y).predict(design.X)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    half = len(design) // 2
    m = CorrectionMLP(**FAST, random_state=3).fit(design.X[:half], design.y[:half])
    m.fit(design.X, design.y)  # a second fit starts over
    np.testing.assert_array_equal(m.predict(design.X), a)


@pytest.mark.parametrize("form", ["free", "roofline", "mixed"])
def test_numpy_prediction_matches_the_torch_network(design, form):
    m = CorrectionMLP(form=form, **FAST).fit(design.X, design.y)
    with torch.no_grad():
        xt = torch.as_tensor(m._scale(design.X), dtype=torch.float32)
        parts = torch.as_tensor(m._parts(design.X), dtype=torch.float32)
        ref = m._forward(xt, parts).double().numpy()
    ref = np.clip(ref, m.y_min_ - m.clip_margin, m.y_max_ + m.clip_margin)
    np.testing.assert_allclose(m.predict(design.X), ref, atol=1e-4)


def test_mlp_rejects_bad_input(design, fitted):
    with pytest.raises(CostModelError, match="columns"):
        fitted.predict(design.X[:, :5])
    with pytest.raises(CostModelError, match="form"):
        CorrectionMLP(form="nope").fit(design.X, design.y)
    with pytest.raises(CostModelError, match="NaN"):
        CorrectionMLP(**FAST).fit(design.X, np.full(len(design), np.nan))
    with pytest.raises(CostModelError, match="hyper-parameter"):
        CorrectionMLP().set_params(epochs=3)


def test_mlp_learns_the_correction_it_was_not_told(design):
    """Trained on 5 of 7 graphs, the MLP beats the roofline and one global factor on the
    other 2 (fake latencies: a feature-dependent factor the model must discover)."""
    held = np.isin(design.groups, ["mlp", "transformer-block"])
    m = CorrectionMLP(steps=800, n_members=1).fit(design.X[~held], design.y[~held])
    err = np.abs(np.exp(m.predict(design.X[held]) - design.y[held]) - 1).mean()
    err_analytical = np.abs(np.exp(-design.y[held]) - 1).mean()
    bias = np.median(design.y[~held])
    err_bias = np.abs(np.exp(bias - design.y[held]) - 1).mean()
    assert err < 0.75 * err_analytical
    assert err < err_bias


def test_roofline_form_never_beats_the_roofs(design, spec):
    m = CorrectionMLP(form="roofline", **FAST).fit(design.X, design.y)
    fr = m.predict_fractions(design.X)
    assert ((fr[:, :2] > 0) & (fr[:, :2] < 1)).all() and (fr[:, 2] > 0).all()
    tc, tm = (10 ** design.X[:, FEATURE_NAMES.index(p)] for p in ("t_compute", "t_memory"))
    predicted = design.analytical_s * np.exp(m.predict(design.X))
    assert (predicted >= np.maximum(tc, tm) * (1 - 1e-5)).all()


def test_ensemble_predicts_the_mean_of_its_members(design):
    """n_members networks, each with its own seed: the prediction is their mean log-ratio,
    and member 0 is exactly the single network of the same random_state."""
    ens = CorrectionMLP(**{**FAST, "n_members": 3}, random_state=2).fit(design.X, design.y)
    single = CorrectionMLP(**FAST, random_state=2).fit(design.X, design.y)
    assert len(ens.nets_) == 3
    members = []
    for net in ens.nets_:
        one = CorrectionMLP(**FAST, random_state=2)
        one.__dict__.update({k: v for k, v in vars(ens).items() if k.endswith("_")})
        one.nets_, one._weights = [net], None
        members.append(one.predict(design.X))
    np.testing.assert_allclose(members[0], single.predict(design.X), atol=1e-12)
    assert not np.allclose(members[0], members[1])  # the members differ
    lo, hi = ens.y_min_ - ens.clip_margin, ens.y_max_ + ens.clip_margin
    np.testing.assert_allclose(
        ens.predict(design.X), np.clip(np.mean(members, axis=0), lo, hi), atol=1e-12
    )
    with pytest.raises(CostModelError, match="n_members"):
        CorrectionMLP(**{**FAST, "n_members": 0}).fit(design.X, design.y)


def test_ape_loss_settles_on_the_lower_mode_of_scattered_timings():
    """One group timed at 1x and 3x the roofline, half the time each (the H100 data has such
    pairs): the percentage-error loss predicts near the low mode (error 0% and 67%, not
    42% and 52% for the geometric mean that the log-space Huber loss picks)."""
    X = np.zeros((200, len(FEATURE_NAMES)))  # one group: nothing to tell the rows apart
    y = np.where(np.arange(200) % 2 == 0, 0.0, math.log(3.0))
    ape = CorrectionMLP(steps=300, n_members=1, loss="ape", dropout=0.0).fit(X, y).predict(X)
    huber = CorrectionMLP(steps=300, n_members=1, dropout=0.0).fit(X, y).predict(X)
    assert np.median(ape) < 0.25 * math.log(3.0) < 0.5 * math.log(3.0) - 0.1 < np.median(huber)
    with pytest.raises(CostModelError, match="loss"):
        CorrectionMLP(loss="mse").fit(X, y)


# ---- persistence ----------------------------------------------------------------------------
def test_save_load_round_trip_without_pickle(tmp_path, fitted, design, spec):
    meta = save_model(
        fitted, tmp_path / "m.json", spec=spec, data_hash="abc", metrics={"x": 1.0}, command="c"
    )
    json_path, npz_path = paths_for(tmp_path / "m.json")
    assert json_path.is_file() and npz_path.is_file()
    with np.load(npz_path, allow_pickle=False) as z:  # plain arrays, nothing to unpickle
        assert "scaler_mean" in z.files
    loaded, meta2 = load_model(tmp_path / "m", device="h100")
    np.testing.assert_allclose(loaded.predict(design.X), fitted.predict(design.X), rtol=1e-6)
    assert meta2.model_id == meta.model_id and meta2.metrics == {"x": 1.0}
    assert meta2.feature_names == FEATURE_NAMES and meta2.device == "h100"
    again = save_model(fitted, tmp_path / "n.json", spec=spec)
    assert again.model_id == meta.model_id  # the id names the weights, not the file


def test_mixed_form_is_the_free_and_roofline_models_side_by_side(tmp_path, design, spec):
    """form="mixed" fits n_members networks of each form with the seeds each form's own
    model uses, so mixed_of(free, roofline) (what cross-validation builds instead of
    fitting again) is the same model; it saves, loads and refuses unlike parts."""
    params = {**FAST, "n_members": 2, "random_state": 5}
    free = CorrectionMLP(form="free", **params).fit(design.X, design.y)
    roof = CorrectionMLP(form="roofline", **params).fit(design.X, design.y)
    mixed = CorrectionMLP(form="mixed", **params).fit(design.X, design.y)
    assert mixed.net_forms() == ["free", "free", "roofline", "roofline"]
    built = CorrectionMLP.mixed_of(free, roof)
    assert built.get_params() == mixed.get_params()
    np.testing.assert_allclose(built.predict(design.X), mixed.predict(design.X), atol=1e-12)
    lo, hi = mixed.y_min_ - mixed.clip_margin, mixed.y_max_ + mixed.clip_margin
    halves = (free.predict(design.X) + roof.predict(design.X)) / 2  # unclipped inside
    assert np.mean(np.abs(mixed.predict(design.X) - np.clip(halves, lo, hi)) < 1e-9) > 0.9
    np.testing.assert_allclose(mixed.predict_fractions(design.X), roof.predict_fractions(design.X))
    save_model(mixed, tmp_path / "x.json", spec=spec)
    loaded, meta = load_model(tmp_path / "x.json", device="h100")
    assert meta.form == "mixed" and len(loaded.nets_) == 4
    np.testing.assert_allclose(loaded.predict(design.X), mixed.predict(design.X), rtol=1e-6)
    with pytest.raises(CostModelError, match="same other"):
        CorrectionMLP.mixed_of(free, CorrectionMLP(form="roofline", **FAST).fit(design.X, design.y))
    with pytest.raises(CostModelError, match="different rows"):
        half = len(design) // 2
        other = CorrectionMLP(form="roofline", **params).fit(design.X[:half], design.y[:half])
        CorrectionMLP.mixed_of(free, other)


def test_ensemble_round_trip_and_single_network_key_names(tmp_path, design, spec):
    """An ensemble saves every member; member 0 keeps the pre-ensemble array names, so a
    single-network model saved before ensembles existed still loads."""
    ens = CorrectionMLP(**{**FAST, "n_members": 2}).fit(design.X, design.y)
    save_model(ens, tmp_path / "e.json", spec=spec)
    with np.load(tmp_path / "e.npz", allow_pickle=False) as z:
        assert any(k.startswith("net.") for k in z.files)
        assert any(k.startswith("net1.") for k in z.files)
    loaded, meta = load_model(tmp_path / "e.json", device="h100")
    assert meta.params["n_members"] == 2 and len(loaded.nets_) == 2
    np.testing.assert_allclose(loaded.predict(design.X), ens.predict(design.X), rtol=1e-6)
    # saved before ensembles: no n_members (nor loss) in the params, one "net." network
    single = CorrectionMLP(**FAST).fit(design.X, design.y)
    old = {k: v for k, v in single.get_params().items() if k not in ("n_members", "loss")}
    again = CorrectionMLP.from_state(old, single.state_arrays())
    assert len(again.nets_) == 1
    np.testing.assert_allclose(again.predict(design.X), single.predict(design.X), rtol=1e-6)


def test_the_model_id_names_the_plan_context_too(tmp_path, fitted, spec):
    """The planner's group costs go through the plan context, so two saves of one network
    under different contexts are two models; a context edited in the JSON no longer
    matches its id; a model saved before the context was digested still loads."""
    from learned_cost import persist

    a = save_model(fitted, tmp_path / "a.json", spec=spec, plan_context={"scale": 1.0})
    b = save_model(fitted, tmp_path / "b.json", spec=spec, plan_context={"scale": 1.2})
    assert a.model_id != b.model_id
    assert load_model(tmp_path / "b.json")[1].model_id == b.model_id
    data = json.loads((tmp_path / "b.json").read_text())
    data["plan_context"]["scale"] = 1.3
    (tmp_path / "b.json").write_text(json.dumps(data))
    with pytest.raises(CostModelError, match="do not match"):
        load_model(tmp_path / "b.json")
    core = persist._digest_core(
        data["params"], data["feature_schema_hash"], data["spec_figures"], None
    )
    data["model_id"] = f"mlp-{fitted.form}-{persist._arrays_digest(fitted.state_arrays(), core)}"
    (tmp_path / "b.json").write_text(json.dumps(data))
    assert load_model(tmp_path / "b.json")[1].model_id == data["model_id"]


def test_tampered_weights_are_refused(tmp_path, fitted, design, spec):
    save_model(fitted, tmp_path / "m.json", spec=spec)
    other = CorrectionMLP(**FAST, random_state=9).fit(design.X, design.y)
    save_model(other, tmp_path / "o.json", spec=spec)
    shutil.copy(tmp_path / "o.npz", tmp_path / "m.npz")
    with pytest.raises(CostModelError, match="do not match"):
        load_model(tmp_path / "m.json")


def test_schema_or_device_mismatch_warns_and_falls_back(tmp_path, fitted, spec):
    save_model(fitted, tmp_path / "m.json", spec=spec)
    ok = load_corrected(tmp_path / "m.json", "h100")
    assert isinstance(ok, CorrectedModel)
    # another device
    with pytest.warns(CostModelFallbackWarning, match="a100"):
        m = load_corrected(tmp_path / "m.json", "a100")
    assert isinstance(m, AnalyticalModel) and m.spec.name == "a100"
    with pytest.raises(CostModelError, match="device"):
        load_model(tmp_path / "m.json", device="a100")
    # another feature schema
    data = json.loads((tmp_path / "m.json").read_text())
    data["feature_schema_hash"] = "000000000000"
    (tmp_path / "m.json").write_text(json.dumps(data))
    with pytest.warns(CostModelFallbackWarning, match="feature schema"):
        m = load_corrected(tmp_path / "m.json", "h100")
    assert isinstance(m, AnalyticalModel) and m.spec.name == "h100"
    # a plan context that reads graph features this code does not compute
    ctx = {"weights": [0.0], "mean": [0.0], "std": [1.0], "graph_features": ["l3_fill"]}
    save_model(fitted, tmp_path / "g.json", spec=spec, plan_context=ctx)
    with pytest.warns(CostModelFallbackWarning, match="graph features"):
        assert isinstance(load_corrected(tmp_path / "g.json", "h100"), AnalyticalModel)
    # nothing there at all
    with pytest.warns(CostModelFallbackWarning, match="no saved model"):
        assert isinstance(load_corrected(tmp_path / "missing.json", "h100"), AnalyticalModel)


def test_cpu_model_from_another_machine_is_normalized_to_this_one(tmp_path, design, monkeypatch):
    """A CPU correction from another machine (a faked foreign fingerprint) is used, not
    refused: features on the training machine's figures, so the network predicts the same
    correction, applied to this machine's roofline; the warning says by which figures."""
    cpu = get_spec("cpu", measured=False)
    m = CorrectionMLP(**FAST).fit(design.X, design.y)
    save_model(m, tmp_path / "c.json", spec=cpu, device_fingerprints=("cpu-someotherbox",))
    save_model(m, tmp_path / "d.json", spec=cpu, device_fingerprints=(device_fingerprint("cpu"),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # this machine's own model: no warning at all
        same = load_corrected(tmp_path / "d.json", "cpu")
    assert isinstance(same, CorrectedModel) and not same.transferred
    # no device-bench figures here: normalized by the estimate, and the message says so
    monkeypatch.setattr("learned_cost.corrected.get_spec", lambda *a, **k: cpu)
    with pytest.warns(CpuTransferWarning, match="ESTIMATED from /proc/cpuinfo"):
        est = load_corrected(tmp_path / "c.json", "cpu")
    assert isinstance(est, CorrectedModel) and est.transferred
    # device-bench measured this machine at twice the bandwidth and half the launch cost
    peaks = MeasuredPeaks(
        matmul_flops=dict(cpu.matmul_flops),
        mem_bw_Bps=2 * cpu.mem_bw_Bps,
        launch_overhead_s=cpu.launch_overhead_s / 2,
        device_fingerprint=device_fingerprint("cpu"),
        torch_version=torch.__version__,
        measured_at="now",
        vector_flops=dict(cpu.vector_flops),
    )
    here = dataclasses.replace(cpu, measured=peaks)
    monkeypatch.setattr("learned_cost.corrected.get_spec", lambda *a, **k: here)
    with pytest.warns(CpuTransferWarning, match="measured by `fusion-plan device-bench`") as w:
        moved = load_corrected(tmp_path / "c.json", "cpu")
    assert "cpu-someotherbox" in str(w[0].message)
    # and it names the command that adapts the model to this CPU, with the model's path
    assert f"fusion-plan cost adapt --model {tmp_path / 'c.json'}" in str(w[0].message)
    assert isinstance(moved, CorrectedModel) and moved.spec.bandwidth_Bps == 2 * cpu.mem_bw_Bps
    assert moved.feature_spec.bandwidth_Bps == cpu.mem_bw_Bps
    assert moved.version != same.version  # costs on other figures are other costs
    g = graph("zoo:pointwise-chain", "N=1048576,STEPS=4")
    groups = [frozenset({i}) for i in range(len(g.nodes))]
    base_here = AnalyticalModel(here)
    for a, b, nodes in zip(same.group_costs(g, groups), moved.group_costs(g, groups), groups):
        if a.latency_s == 0:
            continue
        assert b.correction == pytest.approx(a.correction)  # the network saw the same features
        assert b.latency_s == pytest.approx(base_here.group_cost(g, nodes).latency_s * a.correction)
        assert b.latency_s < a.latency_s  # memory-bound pointwise ops: the faster memory shows


def test_saved_figures_pin_the_analytical_base(tmp_path, fitted, spec):
    """The base a model corrects is the one it was trained against, whatever the local
    device-bench says later."""
    save_model(fitted, tmp_path / "m.json", spec=spec.with_overrides(name="h100", mem_bw_Bps=1e12))
    m = load_corrected(tmp_path / "m.json", "h100")
    assert isinstance(m, CorrectedModel)
    assert m.spec.bandwidth_Bps == 1e12
    assert read_meta(tmp_path / "m.json").spec_figures["bandwidth_Bps"] == 1e12


# ---- the CostModel ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corrected(fitted, spec):
    return CorrectedModel(AnalyticalModel(spec), fitted, model_id="mlp-free-test")


def test_corrected_model_is_a_cost_model(corrected, spec, fitted):
    g = graph("zoo:transformer-block", "B=2,S=64,D=128,H=4")
    assert isinstance(corrected, CostModel)
    assert "mlp-free-test" in corrected.version
    base = AnalyticalModel(spec)
    groups = [frozenset({i}) for i in range(len(g.nodes))] + [frozenset(range(3, 9))]
    costs = corrected.group_costs(g, groups)
    for nodes, c in zip(groups, costs):
        b = base.group_cost(g, nodes)
        assert isinstance(c, GroupCost)
        assert c.t_compute_s == b.t_compute_s and c.bytes_in == b.bytes_in
        if b.latency_s == 0:  # views only: free, nothing to correct
            assert c.latency_s == 0 and c.correction == 1.0
        else:
            assert c.latency_s == pytest.approx(b.latency_s * c.correction)
        assert corrected.group_cost(g, nodes).latency_s == pytest.approx(c.latency_s)
    views = [i for i, n in enumerate(g.nodes) if n.category is Category.VIEW]
    assert views, "the block has views"
    work = [c for nodes, c in zip(groups, costs) if c.latency_s > 0]
    assert any(abs(math.log(c.correction)) > 0.1 for c in work)  # it does correct
    # it pickles (the collector's compile workers plan with it) and costs the same after
    again = pickle.loads(pickle.dumps(corrected))
    assert [c.latency_s for c in again.group_costs(g, groups)] == [c.latency_s for c in costs]


def test_corrected_model_needs_a_fitted_mlp(spec):
    with pytest.raises(CostModelError, match="fitted"):
        CorrectedModel(AnalyticalModel(spec), CorrectionMLP())


# ---- online update -------------------------------------------------------------------------------
def test_online_bias_follows_a_shifted_device(rows, fitted, spec):
    """Measurements 1.5x slower than at training time: the EW bias moves towards ln 1.5
    and the error on rows not used for the update falls; the version changes."""
    model = CorrectedModel(
        AnalyticalModel(spec), fitted, model_id="t", online=OnlineBias(alpha=0.3)
    )
    shifted = [{**r, "measured_median_s": r["measured_median_s"] * 1.5} for r in rows]
    update, check = shifted[::2], shifted[1::2]

    def err() -> float:
        X, y = model._rows_design(check)
        return float(np.median(np.abs(np.exp(model.mlp.predict(X) + model.online.bias - y) - 1)))

    v0, e0 = model.version, err()
    rep = model.update(update)
    assert rep.used == len(update) and rep.skipped == 0
    assert model.version != v0 and "online" in model.version
    assert abs(model.online.bias - math.log(1.5)) < 0.15
    assert err() < 0.6 * e0


def test_online_update_skips_other_devices_and_failed_rows(rows, fitted, spec):
    model = CorrectedModel(AnalyticalModel(spec), fitted)
    bad = [{**rows[0], "device": "a100"}, {**rows[1], "ok": False}, {**rows[2], "kind": "plan"}]
    rep = model.update(bad)
    assert rep.used == 0 and rep.skipped == 3 and model.online.bias == 0.0


def test_online_update_from_plan_observations(fitted, spec):
    g = graph("zoo:mlp", "B=32,D=256,HID=512,L=2")
    model = CorrectedModel(AnalyticalModel(spec), fitted, online=OnlineBias(alpha=0.5))
    groups = [frozenset({i}) for i in range(len(g.nodes))]
    predicted = model.plan_cost_s(g, groups)
    for _ in range(8):
        model.update([Observation.of_plan(g, groups, 2.0 * predicted)])
    assert model.plan_cost_s(g, groups) == pytest.approx(2.0 * predicted, rel=0.02)


def test_plan_prediction_stays_positive_with_a_negative_fitted_intercept(fitted, spec):
    """per_plan_s is a regression intercept and came out negative on real CPU plan rows;
    a small plan must still be predicted to take time, or the online update skips it."""
    from learned_cost.plan_context import FLOOR, PlanContext

    g = graph("zoo:mlp", "B=2,D=16,HID=32,L=1")
    groups = [frozenset({i}) for i in range(len(g.nodes))]
    plain = CorrectedModel(AnalyticalModel(spec), fitted)
    total = plain.plan_cost_s(g, groups)
    model = CorrectedModel(
        AnalyticalModel(spec), fitted, plan_context=PlanContext(per_plan_s=-10 * total)
    )
    assert model.plan_cost_s(g, groups) == pytest.approx(FLOOR * total)
    assert model.update([Observation.of_plan(g, groups, total)]).used == 1


def test_the_planner_sees_the_in_plan_factor_of_each_group(fitted, spec, tmp_path):
    """A context whose factor doubles groups with a GEMM (and leaves the rest) reaches
    the planner's group costs, group by group, and the saved model keeps it."""
    from learned_cost.plan_context import PlanContext

    g = graph("zoo:mlp", "B=2,D=16,HID=32,L=1")
    groups = [frozenset({i}) for i in range(len(g.nodes))]
    plain = CorrectedModel(AnalyticalModel(spec), fitted)
    k = FEATURE_NAMES.index("has_gemm")
    w = [0.0] * len(FEATURE_NAMES)
    w[k] = math.log(2.0)
    mean, std = [0.0] * len(FEATURE_NAMES), [1.0] * len(FEATURE_NAMES)
    ctx = PlanContext(weights=tuple(w), mean=tuple(mean), std=tuple(std), n_plans=99)
    model = CorrectedModel(AnalyticalModel(spec), fitted, plan_context=ctx)
    for grp, a, b in zip(groups, plain.group_costs(g, groups), model.group_costs(g, groups)):
        gemm = g.nodes[next(iter(grp))].op == "linear"
        if a.latency_s > 0:
            assert b.latency_s == pytest.approx(a.latency_s * (2.0 if gemm else 1.0))
    model.save(tmp_path / "m.json")
    loaded = load_corrected(str(tmp_path / "m.json"), spec.name)
    assert loaded.plan_context == ctx
    assert [c.latency_s for c in loaded.group_costs(g, groups)] == pytest.approx(
        [c.latency_s for c in model.group_costs(g, groups)]
    )


def test_online_last_layer_steps_move_the_network(rows, design, spec):
    """With last_layer_steps, the network itself (not only the bias) moves towards new
    measurements: its own error on them falls."""
    mlp = CorrectionMLP(**FAST).fit(design.X, design.y)
    target = design.y + math.log(2.0)
    before = float(np.mean((mlp.predict(design.X) - target) ** 2))
    model = CorrectedModel(AnalyticalModel(spec), mlp, online=OnlineBias(last_layer_steps=20))
    model.update([{**r, "measured_median_s": r["measured_median_s"] * 2} for r in rows])
    after = float(np.mean((mlp.predict(design.X) - target) ** 2))
    assert after < 0.95 * before


def test_learned_cost_imports_no_optuna_or_sklearn():
    """What a planning run imports (learned_cost's public surface) stays light."""
    code = (
        "import sys, learned_cost, learned_cost.corrected; "
        "print(sorted(m for m in ('optuna', 'sklearn', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_planner_passes_each_graphs_footprint_to_the_in_plan_factor(fitted, spec, tmp_path):
    """A context whose factor reads the graph's footprint (exp(0.1 footprint), here) scales
    every work group of that graph by it; the saved model keeps the graph features."""
    from learned_cost.plan_context import GRAPH_FEATURES, PlanContext, graph_footprint

    g = graph("zoo:mlp", "B=2,D=16,HID=32,L=1")
    groups = [frozenset({i}) for i in range(len(g.nodes))]
    plain = CorrectedModel(AnalyticalModel(spec), fitted)
    n = len(FEATURE_NAMES) + len(GRAPH_FEATURES)
    w = [0.0] * n
    w[len(FEATURE_NAMES)] = 0.1  # graph_footprint_over_l2
    ctx = PlanContext(
        weights=tuple(w),
        mean=(0.0,) * n,
        std=(1.0,) * n,
        n_plans=99,
        graph_features=GRAPH_FEATURES,
    )
    a = graph_footprint(g, spec)
    assert a < 0  # a toy MLP fits any L2
    model = CorrectedModel(AnalyticalModel(spec), fitted, plan_context=ctx)
    work = 0
    for x, y in zip(plain.group_costs(g, groups), model.group_costs(g, groups)):
        if x.latency_s > 0:
            work += 1
            assert y.latency_s == pytest.approx(x.latency_s * math.exp(0.1 * a))
    assert work >= 2
    model.save(tmp_path / "m.json")
    loaded = load_corrected(str(tmp_path / "m.json"), spec.name)
    assert loaded.plan_context == ctx and loaded.plan_context.needs_footprint
    assert loaded.plan_cost_s(g, groups) == pytest.approx(model.plan_cost_s(g, groups))


def test_rows_of_mixed_descriptor_versions_are_warned_about():
    spec = get_spec("h100")
    rows = [dict(r, desc_descriptor_version=4) for r in fake_rows(6, seed=3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        design_matrix(rows, lambda _n: spec)  # one version: silent
    for r in rows[::2]:
        r["desc_descriptor_version"] = 3
    with pytest.warns(UserWarning, match=r"descriptors of versions \[3, 4\]"):
        design_matrix(rows, lambda _n: spec)
