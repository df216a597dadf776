"""The held-out study (learned_cost/study/heldout.py): grouping by architecture and graph group,
seeded grouped folds, nested choice of the MLP form, the report's tables.

Rows are fakes (real zoo groups, made-up latencies: tests/learned_fakes.py)."""

from __future__ import annotations

import numpy as np
import pytest
from learned_fakes import GRAPHS, fake_rows, graph

from learned_cost.study import heldout
from learned_cost.study.heldout import (
    NESTED,
    StudyConfig,
    architecture_of,
    graph_group_of,
    nested_cv,
    run_study,
    shuffled_group_folds,
    with_split_keys,
)
from learned_cost.study.heldout_report import read_study, render_study
from learned_cost.study.hw_features import HW_NAMES, hw_matrix
from learned_cost.study.plan_eval import GraphCache
from planner.errors import CostModelError
from planner.features import group_descriptor
from planner.hardware import get_spec

FAST = {"steps": 60, "n_members": 1}  # the choice is tested, not the fit
QUICK = {"mlp-free": FAST, "mlp-roofline": FAST, "mlp-mixed": FAST, "gbt": {"n_estimators": 20}}
SDPA = ("zoo:transformer-block-sdpa", "B=2,S=64,D=128,H=4")


@pytest.fixture(scope="module")
def rows():
    return with_split_keys(fake_rows(12, seed=3, graphs=(*GRAPHS, SDPA)))


def test_architecture_is_the_model_class_so_variants_go_together():
    block = architecture_of("zoo:transformer-block")
    assert block.endswith(".TransformerBlock")
    assert architecture_of("zoo:transformer-block-sdpa") == block
    others = {architecture_of(f"zoo:{n}") for n in ("gpt2-block", "llama-block", "bert-layer")}
    assert block not in others and len(others) == 3
    # a spec that does not build here keeps its own name (a group of its own)
    assert architecture_of("zoo:no-such-model") == "zoo:no-such-model"


def test_graph_group_holds_dtype_and_realization_siblings():
    def row(model: str, shape: str, dtype: str = "float32") -> dict:
        return {"model": model, "shape": shape, "dtype": dtype}

    a = graph_group_of(row("zoo:transformer-block", "B=2,S=64,D=128,H=4"))
    assert graph_group_of(row("zoo:transformer-block", "B=2,S=64,D=128,H=4", "bfloat16")) == a
    assert graph_group_of(row(*SDPA)) == a  # the SDPA realization of the same block
    assert graph_group_of(row("zoo:transformer-block", "H=4,D=128,S=64,B=2")) == a
    assert graph_group_of(row("zoo:transformer-block", "B=4,S=64,D=128,H=4")) != a
    assert graph_group_of(row("zoo:gpt2-block", "B=2,S=64,D=128,H=4")) != a


def test_shuffled_folds_keep_groups_whole_and_move_with_the_seed():
    rng = np.random.default_rng(0)
    keys = np.array([f"g{i}" for i in rng.integers(0, 12, size=300)], dtype=object)
    partitions = set()
    for seed in range(6):
        folds = list(shuffled_group_folds(seed)(keys, 4))
        assert len(folds) == 4
        seen = np.concatenate([te for _, te in folds])
        assert sorted(seen.tolist()) == list(range(len(keys)))  # every row held out once
        for tr, te in folds:
            assert not set(keys[tr]) & set(keys[te])
        sizes = [len(te) for _, te in folds]
        assert max(sizes) - min(sizes) <= max(np.unique(keys, return_counts=True)[1])
        partitions.add(frozenset(frozenset(keys[te]) for _, te in folds))
        again = list(shuffled_group_folds(seed)(keys, 4))
        assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again))
    assert len(partitions) > 2  # other seeds, other folds
    with pytest.raises(CostModelError, match="at least 5 groups"):
        list(shuffled_group_folds(0)(keys[:1], 5))


def test_nested_form_is_chosen_without_the_outer_fold(rows, monkeypatch):
    spec = get_spec("h100")
    groups = [r for r in rows if r["kind"] == "group"]
    # the MLP's groups measured again in a LLaMA block: twins across architectures
    copies = [
        {**r, "model": "zoo:llama-block", "family": "llama-block", "key": r["key"] + "-copy"}
        for r in groups
        if r["family"] == "mlp"
    ]
    groups = with_split_keys(groups + copies)
    seen: list[set[str]] = []
    inner_cv = heldout.cross_validate

    def recording(rs, *a, **k):
        seen.append({r["key"] for r in rs})
        return inner_cv(rs, *a, **k)

    monkeypatch.setattr(heldout, "cross_validate", recording)
    n_arch = len({r["architecture"] for r in groups})  # one architecture per fold
    res = nested_cv(
        groups, lambda _n: spec, split="architecture", n_splits=n_arch, seed=1, overrides=QUICK
    )
    cv = res.cv
    keys = np.array([r["key"] for r in groups], dtype=object)
    assert len(seen) == 1 + n_arch  # the outer CV, then one inner CV per outer fold
    for k, form in enumerate(res.chosen_forms):
        te = cv.fold == k
        assert not seen[1 + k] & set(keys[te])  # the inner CV never saw the scored rows
        assert seen[1 + k] == set(keys[~te])
        np.testing.assert_array_equal(
            cv.oof_log_ratio[NESTED][te], cv.oof_log_ratio[f"mlp-{form}"][te]
        )
        assert cv.fitted[k][NESTED + "+twins"] is cv.fitted[k][f"mlp-{form}+twins"]
    # the block and its SDPA variant are held out together
    arch = np.array([r["family"] for r in groups], dtype=object)
    assert set(cv.fold[arch == "transformer-block"]) == set(cv.fold[arch == SDPA[0][4:]])
    # twins: exactly the MLP's rows and their copies have one in the other folds' rows
    twinned = [r["family"] == "mlp" or r["key"].endswith("-copy") for r in groups]
    np.testing.assert_array_equal(res.has_twin, twinned)
    lone = ~res.has_twin
    np.testing.assert_array_equal(
        cv.oof_log_ratio["gbt+twins"][lone], cv.oof_log_ratio["gbt"][lone]
    )


@pytest.mark.slow  # every model over 2 seeds x 3 folds, plus the inner CVs: minutes on 2 cores
def test_study_reports_every_model_without_and_with_twins_over_seeds(rows, tmp_path):
    spec = get_spec("h100")
    groups = [r for r in rows if r["kind"] == "group"]
    plans = [r for r in rows if r["kind"] == "plan"]
    graphs = GraphCache(lambda m, s, d, device: graph(m, s, d) if device == "meta" else None)
    cfg = StudyConfig(
        splits=("architecture",),
        seeds=(0, 1),
        n_splits=3,
        mlp_params=FAST,
        baseline_params={"gbt": QUICK["gbt"]},
    )
    progress = []
    study = run_study(groups, plans, spec, cfg, graphs, on_progress=lambda r: progress.append(1))
    assert len(progress) == 2
    rec = study["splits"]["architecture"]
    assert [s["seed"] for s in rec["seeds"]] == [0, 1]
    assert rec["seeds"][0]["held_out"] != rec["seeds"][1]["held_out"]  # seeded folds
    mapes = [s["scores"]["gbt"]["groups"]["mape"] for s in rec["seeds"]]
    assert rec["summary"]["gbt"]["groups.mape"]["mean"] == pytest.approx(np.mean(mapes))
    assert rec["summary"]["gbt"]["groups.mape"]["sd"] == pytest.approx(np.std(mapes, ddof=1))
    assert rec["seeds"][0]["scores"][NESTED]["plans"]["n_plans"] == len(plans)
    text = render_study(study, "mlp-mixed+twins")
    without, with_twins = text.split("Without twins:")[1].split("With twins:")
    assert "| gbt |" in without and "| mlp-nested |" in without and "+twins" not in without
    assert "| gbt+twins |" in with_twins and "| mlp-nested+twins |" in with_twins
    assert "Targets (issue 21) for mlp-mixed+twins" in text and "±" in text
    assert "transformer-block, transformer-block-sdpa (`TransformerBlock`)" in text
    path = tmp_path / "s.json"
    path.write_text("[1, 2]")
    with pytest.raises(CostModelError, match="not a held-out study"):
        read_study(path)


def test_cost_heldout_cli_writes_a_study_the_report_shows(rows, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cli.main import main

    data = tmp_path / "fake.parquet"
    keep = [{k: v for k, v in r.items() if k not in ("architecture", "graph_group")} for r in rows]
    pq.write_table(pa.Table.from_pylist(keep), data)
    study, doc = tmp_path / "s.json", tmp_path / "doc.md"
    args = ["--data", str(data), "--device", "h100", "--split", "architecture", "--seeds", "0"]
    args += ["--folds", "2", "--steps", "30", "--members", "1", "--gbt-trees", "10"]
    assert main(["cost", "heldout", *args, "--stored-descriptors", "--out", str(study)]) == 0
    rec = read_study(study)
    assert (
        rec["command"].startswith("fusion-plan cost heldout --data")
        and "--stored" in rec["command"]
    )
    assert [s["seed"] for s in rec["splits"]["architecture"]["seeds"]] == [0]
    assert "| mlp-nested+twins |" in capsys.readouterr().out
    assert main(["cost", "report", "--models", "--studies", str(study), "--out", str(doc)]) == 0
    text = doc.read_text()
    assert "held out by architecture" in text and rec["command"] in text
    assert "plan rows NOT scored" in text
    assert main(["cost", "heldout", *args, "--split", "nonsense", "--out", str(study)]) == 2
    assert "unknown split 'nonsense'" in capsys.readouterr().err


def test_cost_heldout_data_takes_comma_separated_files_of_one_device(rows, tmp_path, capsys):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from cli.main import main
    from learned_cost.data import group_rows, load_profiles

    keep = [{k: v for k, v in r.items() if k not in ("architecture", "graph_group")} for r in rows]
    half = len(keep) // 2
    a, b, cpu = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "cpu.parquet"
    pq.write_table(pa.Table.from_pylist(keep[:half]), a)
    pq.write_table(pa.Table.from_pylist(keep[half:]), b)
    pq.write_table(pa.Table.from_pylist([{**r, "device": "cpu"} for r in keep[:half]]), cpu)
    study = tmp_path / "s.json"
    args = ["--device", "h100", "--split", "architecture", "--seeds", "0", "--folds", "2"]
    args += ["--steps", "30", "--members", "1", "--gbt-trees", "10", "--stored-descriptors"]
    assert main(["cost", "heldout", "--data", f"{a},{b}", *args, "--out", str(study)]) == 0
    rec = json.loads(study.read_text())
    # both files' rows (a row whose key came already is read once: load_profiles)
    alone = [len(group_rows(load_profiles(f), device="h100")) for f in (a, b)]
    both = len(group_rows(load_profiles([a, b]), device="h100"))
    assert rec["n_group_rows"] == both and both > max(alone)
    assert rec["data_files"] == [str(a), str(b)]
    capsys.readouterr()
    assert main(["cost", "heldout", "--data", f"{a},{tmp_path / 'no.parquet'}", *args]) == 2
    assert "no.parquet does not exist" in capsys.readouterr().err
    assert main(["cost", "heldout", "--data", f"{a},{cpu}", *args]) == 2
    assert "holds no rows of 'h100' (its rows are of ['cpu'])" in capsys.readouterr().err


def test_hardware_features_see_tile_and_wave_quantization():
    spec = get_spec("h100")
    g = graph("zoo:matmul", "M=130,K=100,N=128")
    mm = next(i for i, n in enumerate(g.nodes) if n.flops)
    desc = group_descriptor(g, frozenset({mm}))
    row = {f"desc_{k}": v for k, v in desc.items()}
    x = dict(zip(HW_NAMES, hw_matrix([row], spec)[0]))
    assert x["gemm_m_fill"] == pytest.approx(130 / 256)  # 130 rows pay for two 128-row tiles
    assert x["gemm_k_fill"] == pytest.approx(100 / 128)
    assert x["gemm_wave_fill"] == pytest.approx(2 / spec.sm_count)  # 2 tiles, one wave
    assert 10 ** x["gemm_padded_over_useful"] == pytest.approx(256 * 128 * 128 / (130 * 128 * 100))
    assert x["log_kernels"] == pytest.approx(np.log1p(desc["n_kernels"]))


def test_hardware_feature_study_compares_the_mlp_on_the_same_folds(rows):
    from learned_cost.study.hw_features import compare, render

    spec = get_spec("h100")
    rows = [r for r in rows if r["kind"] == "group"]
    mlp = {"steps": 20, "hidden": (8,), "n_members": 1}
    res = compare(
        rows, spec, seeds=(0,), n_splits=3, gbt_params={"n_estimators": 5}, mlp_params=mlp
    )
    names = set(res["seeds"][0]["scores"])
    assert names == {
        f"{b}{h}{t}"
        for b in ("gbt", "mlp-free")
        for h in ("", "-hw", "-v6")
        for t in ("", "+twins")
    }
    only_gbt = compare(rows, spec, seeds=(0,), n_splits=3, gbt_params={"n_estimators": 5})
    # the trees are fitted on the same folds with the same seed either way
    assert only_gbt["seeds"][0]["scores"]["gbt"] == res["seeds"][0]["scores"]["gbt"]
    assert "| mlp-free-hw+twins |" in render(res)
