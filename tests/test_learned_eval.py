"""Evaluation of the learned correction: metrics, grouped splits, the cost CLI, real data.

Metric and split tests use fake rows (tests/learned_fakes.py); the last tests run on the
committed datasets under data/ and the committed models under learned_cost/models/.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from learned_fakes import fake_rows, graph

from cli.main import main
from learned_cost.corrected import CorrectedModel, CpuTransferWarning, load_corrected
from learned_cost.data import (
    Profiles,
    group_rows,
    load_profiles,
    noisy_rows,
    plan_rows,
    plan_timing,
)
from learned_cost.persist import read_meta
from learned_cost.plan_context import PlanContext, fit_plan_context
from learned_cost.study.evaluate import (
    MODEL_NAMES,
    MODELS,
    cross_validate,
    group_metrics,
    plan_metrics,
    repeatability,
)
from learned_cost.study.plan_eval import GraphCache, evaluate_plans
from learned_cost.study.plots import family_styles
from learned_cost.study.train import TrainConfig, train
from planner.errors import CostModelError
from planner.hardware import device_fingerprint, get_spec

REPO = Path(__file__).resolve().parents[1]


def fake_graphs() -> GraphCache:
    """Plan graphs from the fakes' own capture cache (they were captured on meta)."""
    return GraphCache(lambda m, s, d, device: graph(m, s, d) if device == "meta" else None)


FAST = {"steps": 300, "n_members": 1}
QUICK = {"mlp-free": FAST, "mlp-roofline": FAST, "mlp-mixed": FAST, "gbt": {"n_estimators": 60}}


# ---- metrics ------------------------------------------------------------------------------
def test_group_metrics_on_known_numbers():
    measured = np.array([1.0, 2.0, 4.0, 8.0])
    perfect = group_metrics(measured.copy(), measured, np.array(["g"] * 4, dtype=object))
    assert perfect.mape == 0 and perfect.kendall_tau == pytest.approx(1.0)
    assert perfect.kendall_tau_within == pytest.approx(1.0)
    m = group_metrics(np.array([1.1, 1.8, 4.0, 4.0]), measured, np.array(["g"] * 4, dtype=object))
    assert m.mape == pytest.approx((0.1 + 0.1 + 0 + 0.5) / 4)
    assert m.median_ape == pytest.approx(0.1)


def test_plan_regret_is_measured_cost_of_the_top_ranked_plan():
    # graph a: the model ranks plan 1 first (pred 1.0), but plan 0 measured faster.
    pred = np.array([2.0, 1.0, 5.0, 3.0, 3.5])
    meas = np.array([1.0, 1.25, 4.0, 2.0, 2.2])
    m = plan_metrics(pred, meas, ["a", "a", "a", "b", "b"])
    assert m.n_graphs == 2
    assert m.mean_regret == pytest.approx((0.25 + 0.0) / 2)
    assert m.max_regret == pytest.approx(0.25)
    assert m.plan_mape == pytest.approx(np.mean(np.abs(pred - meas) / meas))


def test_plan_context_recovers_scale_and_per_group_cost_despite_outliers():
    rng = np.random.default_rng(0)
    sums = rng.uniform(1e-5, 1e-3, 60)
    n = rng.integers(1, 40, 60).astype(float)
    measured = (1.2 * sums + 20e-6 * n + 30e-6) * rng.normal(1.0, 0.02, 60)
    measured[:5] *= 6.0  # plans timed while the machine was busy
    ctx = fit_plan_context(sums, n, measured)
    assert ctx.scale == pytest.approx(1.2, rel=0.05)
    assert ctx.per_group_s == pytest.approx(20e-6, rel=0.15)
    assert ctx.per_plan_s == pytest.approx(30e-6, rel=0.3)
    assert ctx.n_plans == 60
    assert fit_plan_context(sums[:3], n[:3], measured[:3]) == PlanContext()  # too few: identity
    lat = np.array([1e-5, 2e-3])
    assert ctx.apply_sum(lat) == pytest.approx(sum(ctx.apply(x) for x in lat) + ctx.per_plan_s)


def test_in_plan_factor_learns_which_groups_cost_more_in_a_plan():
    """Groups whose feature 0 is high run 1.5x slower in a plan than alone (a GEMM whose
    weights a plan evicts from L2): the per-group factor finds it, where scale and
    intercepts cannot, and a context fitted on few plans keeps to those."""
    from learned_cost.plan_context import MIN_PLANS_FOR_WEIGHTS, fit_plan_context_groups

    rng = np.random.default_rng(0)
    lats, feats, measured = [], [], []
    for _ in range(120):
        n = int(rng.integers(2, 8))
        t = rng.uniform(5e-6, 2e-4, n)
        X = np.column_stack([rng.integers(0, 2, n), rng.normal(size=n), np.ones(n)])
        lats.append(t)
        feats.append(X)
        measured.append((t * np.where(X[:, 0] == 1, 1.5, 1.0)).sum() * rng.normal(1, 0.01))
    m = np.array(measured)
    sums_only = fit_plan_context(np.array([t.sum() for t in lats]), [len(t) for t in lats], m)
    ctx = fit_plan_context_groups(lats, feats, m)

    def err(c: PlanContext) -> float:
        return np.mean([abs(c.apply_sum(t, X) / mi - 1) for t, X, mi in zip(lats, feats, m)])

    assert err(ctx) < 0.03 < err(sums_only)
    assert ctx.weights[0] > 0 and abs(ctx.weights[0]) > 5 * abs(ctx.weights[1])
    # per group and per plan agree, and the context round-trips through JSON
    t, X = lats[0], feats[0]
    assert ctx.apply_sum(t, X) == pytest.approx(
        sum(ctx.apply(ti, xi) for ti, xi in zip(t, X)) + ctx.per_plan_s
    )
    again = PlanContext.from_json(json.loads(json.dumps(ctx.to_json())))
    assert again == ctx and again.apply_sum(t, X) == ctx.apply_sum(t, X)
    assert PlanContext.from_json({"scale": 1.1}).apply(1e-5, X[0]) == pytest.approx(1.1e-5)
    k = MIN_PLANS_FOR_WEIGHTS - 1
    few = fit_plan_context_groups(lats[:k], feats[:k], m[:k])
    assert few.weights == () and few.n_plans == k
    with pytest.raises(ValueError, match="features"):
        ctx.apply(1e-5, np.ones(5))


def test_in_plan_factor_reads_whether_the_whole_graph_fits_the_l2():
    """Groups that fit the L2 alone run 1.4x slower in a plan only where their graph's
    tensors do not fit too (the plan evicts them): the groups' own features cannot tell
    those plans apart, the graph footprint can. A context fitted with it needs it back."""
    from learned_cost.features import FEATURE_NAMES
    from learned_cost.plan_context import GRAPH_FEATURES, fit_plan_context_groups

    ws = FEATURE_NAMES.index("working_set_over_l2")
    rng = np.random.default_rng(1)
    lats, feats, fps, measured = [], [], [], []
    for _ in range(150):
        n = int(rng.integers(2, 8))
        t = rng.uniform(5e-6, 2e-4, n)
        X = rng.normal(size=(n, len(FEATURE_NAMES)))
        X[:, ws] = rng.uniform(-1.5, 0.5, n)  # log10(bytes / L2): below 0 fits alone
        a = float(rng.uniform(-1.0, 1.0))  # the graph's footprint
        slow = (X[:, ws] < 0) & (a > 0)
        lats.append(t)
        feats.append(X)
        fps.append(a)
        measured.append((t * np.where(slow, 1.4, 1.0)).sum() * rng.normal(1, 0.01))
    m = np.array(measured)
    alone = fit_plan_context_groups(lats, feats, m)
    ctx = fit_plan_context_groups(lats, feats, m, footprints=fps)
    assert ctx.graph_features == GRAPH_FEATURES and alone.graph_features == ()
    assert len(ctx.weights) == len(FEATURE_NAMES) + len(GRAPH_FEATURES)

    def err(c: PlanContext, with_fp: bool) -> float:
        return np.mean(
            [
                abs(c.apply_sum(t, X, a if with_fp else None) / mi - 1)
                for t, X, a, mi in zip(lats, feats, fps, m)
            ]
        )

    assert err(ctx, True) < 0.03 < err(alone, False)
    again = PlanContext.from_json(json.loads(json.dumps(ctx.to_json())))
    assert again == ctx and again.needs_footprint
    t, X, a = lats[0], feats[0], fps[0]
    assert ctx.apply_sum(t, X, a) == pytest.approx(
        sum(ctx.apply(ti, xi, a) for ti, xi in zip(t, X)) + ctx.per_plan_s
    )
    with pytest.raises(ValueError, match="footprint"):
        ctx.apply_sum(t, X)
    with pytest.raises(ValueError, match="refit"):
        PlanContext.from_json({**ctx.to_json(), "graph_features": ["something_else"]}).apply(
            t[0], X[0], a
        )
    with pytest.raises(ValueError, match="footprints for"):
        fit_plan_context_groups(lats, feats, m, footprints=fps[:-1])


def test_repeatability_predicts_each_twin_by_the_others(rows):
    """Identical groups measured again (another graph, another time) are the noise floor:
    each is predicted by the median of its twins; groups without a twin are left out."""
    g, seen = [], set()
    for r in rows:  # three groups that differ from each other
        desc = tuple(sorted((k, str(v)) for k, v in r.items() if k.startswith("desc_")))
        if r["kind"] == "group" and desc not in seen and len(g) < 3:
            g.append(r)
            seen.add(desc)
    lat = g[0]["measured_median_s"]
    twins = [
        {**g[0], "key": "a", "graph_key": "x", "measured_median_s": lat},
        {**g[0], "key": "b", "graph_key": "x", "measured_median_s": 2 * lat},
        {**g[0], "key": "c", "graph_key": "x", "measured_median_s": 4 * lat},
        {**g[0], "key": "d", "graph_key": "y", "measured_median_s": lat, "dtype": "bfloat16"},
    ]
    rep = repeatability([*twins, g[1], g[2]])
    assert rep.n_sets == 1 and list(rep.rows) == [0, 1, 2]  # another dtype is no twin
    # a: median(2, 4) = 3 -> APE 2; b: median(1, 4) = 2.5 -> 0.25; c: median(1, 2) = 1.5 -> 0.625
    assert rep.metrics is not None
    assert rep.metrics.mape == pytest.approx((2 + 0.25 + 0.625) / 3)
    assert rep.to_dict()["n_rows"] == 3
    assert repeatability([g[1], g[2]]).metrics is None


def test_rows_disturbed_while_timed_are_dropped(rows):
    g = [r for r in rows if r["kind"] == "group"][:3]
    quiet = {**g[0], "measured_min_s": g[0]["measured_median_s"] * 0.95}
    busy = {**g[1], "key": "busy", "measured_min_s": g[1]["measured_median_s"] / 3}
    failed = {**g[2], "key": "failed", "ok": False}
    prof = Profiles((quiet, busy, failed), ("t",))
    assert [r["key"] for r in group_rows(prof)] == [quiet["key"]]
    assert noisy_rows(prof, "group") == 1


def test_plans_of_a_device_are_compared_only_when_timed_the_same_way(rows):
    """A device whose plan rows are timed as kernels drops its whole-call plan rows (an
    older dataset beside it); a device with whole calls only keeps them."""
    p = [r for r in rows if r["kind"] == "plan"][:3]
    m = p[0]["measured_median_s"]
    kernels = {**p[0], "key": "kernels", "call_median_s": m * 1.4}
    old_gpu = {**p[1], "key": "old"}  # no call_median_s: collector version 1 or 2
    could_not_capture = {**p[2], "key": "fell", "call_median_s": p[2]["measured_median_s"]}
    cpu = {**p[1], "key": "cpu", "device": "cpu", "call_median_s": p[1]["measured_median_s"]}
    assert [plan_timing(r) for r in (kernels, old_gpu, could_not_capture, cpu)] == [
        "kernels",
        "call",
        "call",
        "call",
    ]
    prof = Profiles((kernels, old_gpu, could_not_capture, cpu), ("t",))
    assert {r["key"] for r in plan_rows(prof)} == {"kernels", "cpu"}
    assert [r["key"] for r in plan_rows(prof, device="cpu")] == ["cpu"]
    only_calls = Profiles((old_gpu, could_not_capture), ("t",))
    assert [r["key"] for r in plan_rows(only_calls)] == ["old", "fell"]


def test_group_rows_are_described_as_the_planner_describes_them_today(rows):
    """Training recomputes each group's descriptor on today's capture of its graph: a
    stale stored descriptor is replaced, a group that now launches nothing (a cast that
    became a view) is left out, and a graph that no longer captures keeps what was stored."""
    from learned_cost.study.plan_eval import current_descriptors

    g = [r for r in rows if r["kind"] == "group"][:3]
    stale = {**g[0], "desc_bytes_in": g[0]["desc_bytes_in"] * 10 + 1}
    llama = graph("zoo:llama-block", "B=1,S=64,D=128,H=4,MAXS=128")
    free = next(n.index for n in llama.nodes if n.op == "type_as")  # a view in fp32
    cast = {**g[1], "key": "cast", "model": "zoo:llama-block", "graph_key": llama.key}
    cast.update(shape="B=1,S=64,D=128,H=4,MAXS=128", nodes=json.dumps([free]))
    gone = {**g[2], "key": "gone", "graph_key": "captured differently once"}
    got = current_descriptors([stale, cast, gone], fake_graphs())
    assert [r["key"] for r in got] == [stale["key"], "gone"]
    assert got[0]["desc_bytes_in"] == g[0]["desc_bytes_in"] and got[1] == gone


# ---- grouped splits -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rows():
    return fake_rows(15, seed=2)


@pytest.mark.parametrize("split", ["family", pytest.param("graph_key", marks=pytest.mark.slow)])
def test_cross_validation_never_splits_a_group(rows, split):
    spec = get_spec("h100")
    g = [r for r in rows if r["kind"] == "group"]
    cv = cross_validate(
        g,
        lambda _n: spec,
        split=split,
        n_splits=3,
        overrides=QUICK,
    )
    keys = np.array([r[split] for r in g], dtype=object)
    for k, held in enumerate(cv.held_out):
        train_keys = set(keys[cv.fold != k])
        assert held and not held & train_keys
        assert set(keys[cv.fold == k]) == held
    assert set(cv.oof_log_ratio) == set(MODEL_NAMES)
    np.testing.assert_array_equal(cv.oof_log_ratio["analytical"], 0.0)
    # the mixed MLP of a fold is built from its free and roofline MLPs, not fitted again
    for models in cv.fitted:
        parts = [*models["mlp-free"].nets_, *models["mlp-roofline"].nets_]
        for x, y in zip(models["mlp-mixed"].nets_, parts, strict=True):
            assert x is not y  # copies: updating one model leaves the others
            for (kx, vx), (ky, vy) in zip(x.state_dict().items(), y.state_dict().items()):
                assert kx == ky and torch.equal(vx, vy)


def test_plans_are_scored_by_models_that_never_saw_their_family(rows):
    spec = get_spec("h100")
    g = [r for r in rows if r["kind"] == "group"]
    p = [r for r in rows if r["kind"] == "plan"]
    cv = cross_validate(g, lambda _n: spec, n_splits=3, overrides=QUICK)
    pe = evaluate_plans(p, cv, lambda _n: spec, fake_graphs())
    assert pe.skipped == 0 and len(pe.measured_s) == len(p)
    for r in p:
        assert r["family"] in cv.held_out[cv.fold_for(r["family"])]
    # the analytical baseline's plan prediction is the sum of its group roofs
    an = pe.predicted_s["analytical"]
    assert (an > 0).all() and (pe.predicted_s["mean-bias"] > an).all()


def test_too_few_groups_for_a_grouped_split_is_a_clear_error(rows):
    spec = get_spec("h100")
    one = [r for r in rows if r["kind"] == "group" and r["family"] == "mlp"]
    with pytest.raises(CostModelError, match="at least 2"):
        cross_validate(one, lambda _n: spec, split="family")


# ---- train end to end, and the CLI --------------------------------------------------------------
def test_train_saves_a_model_with_its_metrics(tmp_path, rows):
    prof = Profiles(tuple(rows), ("fake",))
    cfg = TrainConfig(
        device="h100",
        splits=("family",),
        n_splits=3,
        mlp_params=FAST,
        baseline_params={"gbt": QUICK["gbt"]},
    )
    _, _, meta, form = train(prof, cfg, tmp_path / "m.json", command="test", graphs=fake_graphs())
    assert form in ("free", "roofline") and meta is not None
    rec = meta.metrics["splits"]["family"]
    assert [s["name"] for s in rec["scores"]] == list(MODEL_NAMES)
    assert "| mlp-free |" in rec["table"] and rec["verdicts"]
    assert meta.n_rows == len(group_rows(prof)) and meta.data_hash == prof.data_hash
    assert "n_rows" in meta.metrics["repeatability"]  # the noise floor travels with the model
    assert isinstance(load_corrected(tmp_path / "m.json", "h100"), CorrectedModel)


@pytest.mark.slow
def test_cost_cli_train_eval_report(tmp_path, rows, capsys):
    data = tmp_path / "fake.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    out, plot, doc = tmp_path / "m.json", tmp_path / "p.png", tmp_path / "doc.md"
    args = ["--data", str(data), "--device", "h100", "--folds", "3", "--steps", "300"]
    assert main(["cost", "train", *args, "--out", str(out), "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    for name in MODEL_NAMES:
        assert f"| {name} |" in text
    assert out.is_file() and out.with_suffix(".npz").is_file() and plot.stat().st_size > 10_000
    assert "cost train --data" in read_meta(out).command
    assert main(["cost", "eval", *args, "--model", str(out), "--plot", str(plot)]) == 0
    assert "| gbt |" in capsys.readouterr().out
    assert main(["cost", "report", "--models", str(out), "--out", str(doc)]) == 0
    text = doc.read_text()
    assert "| mlp-roofline |" in text and "## Features" in text


@pytest.mark.parametrize(
    "flag, value, message",
    [("--dropout", "1.5", "in [0, 1)"), ("--hidden", "64,x", "positive layer widths")],
)
def test_cost_cli_refuses_bad_mlp_settings(flag, value, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["cost", "train", "--data", "unused.parquet", flag, value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# ---- the committed data and models ---------------------------------------------------------------
CPU_DATA = REPO / "data" / "cpu_profiles.parquet"
CPU_MODEL = REPO / "learned_cost" / "models" / "cpu.json"
H100_MODEL = REPO / "learned_cost" / "models" / "h100.json"


H100_DATA = REPO / "data" / "h100_profiles.parquet"


@pytest.mark.parametrize(
    "data, device",
    [pytest.param(CPU_DATA, "cpu", marks=pytest.mark.slow), (H100_DATA, "h100")],
    ids=["cpu", "h100"],
)
def test_correction_improves_held_out_error_on_committed_data(data, device):
    """On real measurements (this machine's CPU dataset, the lent H100's), whole graphs
    held out, the MLP's error is lower than the roofline's and than one global factor's."""
    if not data.is_file():
        pytest.skip(f"no committed {device} dataset")
    prof = load_profiles(data)
    spec = get_spec(device)
    g = group_rows(prof, device=device)
    cv = cross_validate(
        g,
        lambda _n: spec,
        split="graph_key",
        n_splits=3,
        models=[m for m in MODELS if m[0] in ("analytical", "mean-bias", "mlp-free")],
        overrides={"mlp-free": {"steps": 1000, "n_members": 1}},
    )
    measured = cv.design.measured_s
    assert len(measured) > 500  # the committed datasets' group rows, not a sliver
    err = {n: group_metrics(cv.predicted_s(n), measured, cv.graph_ids) for n in cv.oof_log_ratio}
    assert err["mlp-free"].mape < err["analytical"].mape
    assert err["mlp-free"].mape < err["mean-bias"].mape
    assert err["mlp-free"].median_ape < err["mean-bias"].median_ape


@pytest.mark.parametrize("path", [CPU_MODEL, H100_MODEL], ids=["cpu", "h100"])
def test_committed_models_load_with_this_code(path):
    if not path.is_file():
        pytest.skip(f"{path.name} not trained yet")
    meta = read_meta(path)
    assert meta.command.startswith("fusion-plan cost train")
    assert meta.metrics["splits"], "a committed model carries its held-out metrics"
    if meta.device_kind == "cpu" and device_fingerprint("cpu") not in meta.device_fingerprints:
        # a CPU model of another machine: used normalized to this one, and says so
        with pytest.warns(CpuTransferWarning, match="NORMALIZED"):
            model = load_corrected(path, meta.device)
        assert isinstance(model, CorrectedModel) and model.transferred
    else:
        model = load_corrected(path, meta.device)
    assert isinstance(model, CorrectedModel) and meta.model_id in model.version


def test_the_report_shows_the_noise_floor_of_each_committed_model():
    """docs/learned_cost.md is rendered from the saved models; each one's noise floor
    (identical groups' repeat timings) is reported beside the model on the same rows."""
    import json

    from cli.commands.cost import render_report
    from learned_cost.persist import load_model

    metas = []
    for name in ("h100", "cpu"):
        path = f"learned_cost/models/{name}.json"
        metas.append((path, load_model(path, device=None)[1]))
    text = render_report(metas)
    for path, _ in metas:
        rep = json.loads(Path(path).read_text())["metrics"]["repeatability"]
        assert (
            f"| twins' median | {rep['n_rows']} | {100 * rep['twin_median']['mape']:.1f}% |" in text
        )
    assert text.count("### noise floor") == len(metas)


def test_auto_form_is_the_lower_mape_averaged_over_the_splits():
    """free wins the first split by a little and loses the second by more: auto is roofline."""
    from types import SimpleNamespace as NS

    from learned_cost.study.train import choose_form

    def split(free: float, roofline: float, mixed: float = 1.0) -> NS:
        mape = {"mlp-free": free, "mlp-roofline": roofline, "mlp-mixed": mixed}
        return NS(score=lambda name: NS(groups=NS(mape=mape[name])))

    run = NS(splits=[split(0.16, 0.17), split(0.08, 0.05)])
    assert choose_form(run, "auto") == "roofline"
    assert choose_form(NS(splits=[split(0.16, 0.17)]), "auto") == "free"
    assert choose_form(run, "free") == "free"
    # the mean of the two forms wins where it is the better on average, not on either split
    assert (
        choose_form(NS(splits=[split(0.16, 0.17, 0.162), split(0.08, 0.05, 0.055)]), "auto")
        == "mixed"
    )
    with pytest.raises(CostModelError, match="--form"):
        choose_form(run, "bounded")


def test_every_family_gets_its_own_colour_and_marker_in_the_plots():
    families = [f"family-{k}" for k in range(14)]
    styles = family_styles(families * 2)  # repeats name one family once
    assert list(styles) == sorted(families)
    assert len({color for color, _ in styles.values()}) == 14  # 14 colours apart
    many = family_styles([f"f{k:02d}" for k in range(40)])
    assert len(set(many.values())) == 40  # past the palette, colour and marker still differ
