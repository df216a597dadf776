"""`tune` of a tensor-parallel rank program records its tensor-parallel decision
(search/tune_tp.py): searched as `plan` searches it; on 2 gloo ranks measured as served
(tests/tp_ranks.py) and stored only if it measured best; in one process (torch's fake
group) recorded from its prediction, and said so."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from learned_cost.analytical import AnalyticalModel
from planner.hardware import get_spec
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from profiling.commbench import run_ranks
from search.tune import TuneConfig, tune
from tests.tp_ranks import B, D, H, S
from zoo.modelspec import resolve

SHAPE = f"B={B},D={D},H={H},TP=2"


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> Plan:
    """The decision `fusion-plan plan` records for the block on this CPU."""
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    argv = ["plan", "--model", "zoo:tp-block", "--shape", f"{SHAPE},S={S}", "--device", "cpu"]
    argv += ["--cost-model", "analytical", "--strategy", "greedy", "--save-plan", str(out)]
    assert main(argv) == 0
    return Plan.from_json(json.loads(out.read_text()))


@pytest.mark.slow  # about 15 s with its fixture; plan records the same decision in
# tests/test_tp_plan_record.py, which the default run keeps
def test_tune_in_one_process_records_the_decision_from_its_prediction(tmp_path, planned) -> None:
    cfg = TuneConfig(
        spec=resolve("zoo:tp-block", SHAPE),
        dynamic=f"S={S}..{S}",
        strategy="priority",
        top_k=1,
        compile_baseline=False,
        timer={"warmup": 1, "min_reps": 3, "max_reps": 6, "max_seconds": 1.0},
    )
    with PlanCache(str(tmp_path / "c.db")) as cache:
        (r,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
        hit = cache.lookup(r.plan.structure_key, [[B, S, D]])
    assert planned.tensor_parallel is not None
    assert r.plan.tensor_parallel == planned.tensor_parallel  # the same search as `plan`
    assert hit.plan is not None and hit.plan.tensor_parallel == planned.tensor_parallel
    # not measured, and said so: the measured latency is the fusion plan's
    assert "NOT measured" in r.tensor_parallel and "NOT measured" in r.plan.notes
    assert [c.tensor_parallel for c in r.candidates] == [None]
    assert r.plan.measured_s == r.candidates[0].measured.median_s


@pytest.mark.slow  # about 30 s: two ranks each compile and serve two plans
def test_tune_on_gloo_ranks_measures_the_decision_as_served(tmp_path, planned) -> None:
    res = run_ranks(2, "tests.tp_ranks:tuned_on_ranks", (str(tmp_path),), timeout_s=240)
    fusion, with_tp = res["candidates"]
    assert fusion["tp"] is None and fusion["measured_s"], fusion
    # the plan with the decision `plan` chooses, served on the ranks (a decision the
    # backend did not apply would be an error, never a timing)
    assert with_tp["tp"] == planned.tensor_parallel.label and with_tp["measured_s"], with_tp
    assert with_tp["strategy"] == f"{fusion['strategy']}+tp"
    best = min((fusion, with_tp), key=lambda c: c["measured_s"])
    stored = Plan.from_json(res["plan"])
    assert stored.measured_s == best["measured_s"]  # the measured best is what is stored
    if best is with_tp:
        assert stored.tensor_parallel == planned.tensor_parallel
        assert res["cached_tp"] == planned.tensor_parallel.label
        assert "measured on the ranks" in res["note"] and res["note"].endswith(": recorded")
    else:
        assert stored.tensor_parallel is None and res["cached_tp"] is None
        assert "slower than the plan without it: not recorded" in res["note"]
    # both ranks stored the same decision with the same (slowest rank's) latency
    assert res["ranks"][0] == res["ranks"][1], res["ranks"]


@pytest.mark.slow  # about 15 s; the ranks' agreement on a failure is also checked in
# tests/test_tp_plan_record.py, by realizing a decision that fails on one rank
def test_tune_on_gloo_ranks_fails_a_candidate_that_fails_on_one_rank_on_every_rank(
    tmp_path,
) -> None:
    # realizing the first candidate raises on rank 1 only: without an agreement rank 0
    # would go on issuing the plan's collectives alone and the job would hang
    res = run_ranks(2, "tests.tp_ranks:tuned_with_a_failure_on_one_rank", (str(tmp_path),), 90)
    first = [r["candidates"][0] for r in res["ranks"]]
    assert all(c["measured_s"] is None for c in first), first  # failed on every rank
    assert "injected: this rank cannot compile" in first[1]["error"], first
    # rank 0 says which rank failed and why
    assert "on rank 1" in first[0]["error"] and "injected" in first[0]["error"], first
    # every rank stored the same thing (here: nothing, as no candidate was measured)
    assert res["ranks"][0]["plan"] == res["ranks"][1]["plan"]
    assert res["ranks"][0]["stored"] == res["ranks"][1]["stored"]


def _tune_argv(cache: str) -> list[str]:
    model = ["--model", "zoo:tp-block", "--shape", SHAPE, "--dynamic", f"S={S}..{S}"]
    run = ["--strategy", "priority", "--top-k", "1", "--no-compile-baseline"]
    return ["tune", *model, *run, "--cache", cache, "--format", "json"]


def test_tune_as_a_rank_needs_torchruns_environment(tmp_path, monkeypatch, capsys) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert main([*_tune_argv(str(tmp_path / "c.db")), "--dist-backend", "gloo"]) != 0
    assert "torchrun --nproc-per-node" in capsys.readouterr().err


@pytest.mark.slow  # about 40 s: torchrun starts two ranks of the command
def test_tune_cli_under_torchrun_measures_the_decision_on_the_ranks(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    logs = tmp_path / "logs"
    # every rank the same command, each with its own cache (named after its RANK)
    argv = [*_tune_argv(str(tmp_path / "rank{}.db")), "--dist-backend", "gloo"]
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys\nfrom cli.main import main\n"
        f"argv = [a.format(os.environ['RANK']) for a in {argv!r}]\n"
        "sys.exit(main(argv))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--log-dir", str(logs), "--redirects", "1", str(script)]
    done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    outs = sorted(logs.rglob("stdout.log"))
    assert len(outs) == 2
    for out in outs:
        (bucket,) = json.loads(out.read_text())["buckets"]
        fusion, with_tp = bucket["candidates"]
        assert fusion["tensor_parallel"] is None and with_tp["tensor_parallel"], bucket
        assert fusion["measured_s"] and with_tp["measured_s"], bucket
        assert "measured on the ranks" in bucket["tensor_parallel"], bucket
