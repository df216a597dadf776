"""The RL policy: features, the prior, masking, determinism, the shipped weights, training
and per-graph fine-tuning.

The Strategy contract (legal, within budget, reproducible) runs over `rl` and `rl-ft` in
tests/test_strategies.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from planner.errors import FusionPlannerError
from planner.fusion.fuse_rules import default_partition
from planner.fusion.legality import check
from search.merge_env import MergeEnv
from search.rl_policy import (
    DEFAULT_POLICY,
    FEATURE_NAMES,
    FEATURES,
    N_FEATURES,
    Featurizer,
    Policy,
    PolicyNet,
    load_policy,
    log_probs,
    masked_logits,
    rollout,
    save_policy,
)
from search.rl_train import (
    HELD_OUT_SEED,
    HELD_OUT_ZOO,
    TRAIN_ZOO,
    VALIDATION_SEED,
    TrainConfig,
    finetune,
    reinforce_step,
    train,
)
from search.strategies import get_strategy
from search.strategy import Budget
from tests.partition_helpers import h100_objective, zoo_graph
from zoo.randgraph import random_graph

HELD_OUT = [(40, HELD_OUT_SEED + 1), (90, HELD_OUT_SEED + 2), (200, HELD_OUT_SEED + 3)]


def test_feature_schema_is_documented_and_rows_are_finite():
    assert len(set(FEATURE_NAMES)) == N_FEATURES and all(why for _, why in FEATURES)
    for g in (random_graph(60, 3), zoo_graph("gpt2-block")):
        env = MergeEnv(g, h100_objective())
        feat = Featurizer(env)
        env.start()
        pairs = env.legal()
        rows = feat.step(pairs)
        assert rows.shape == (len(pairs), N_FEATURES) and np.isfinite(rows).all()
        best = rows[:, FEATURE_NAMES.index("gain_vs_best")]
        assert best.max() == pytest.approx(1.0) and (best > 0).all()


def test_the_prior_alone_is_priority():
    """The untrained network (MLP output zero) decodes exactly to priority's plan."""
    net = PolicyNet()
    for g in (random_graph(30, 1), random_graph(150, 2), zoo_graph("llama-block")):
        obj = h100_objective()
        ep = rollout(g, obj, net, greedy=True)
        assert ep.complete and ep.partition == get_strategy("priority").plan(g, obj).partition


def test_masked_actions_get_no_probability_and_any_weights_stay_legal():
    logits = torch.tensor([5.0, 1.0, 9.0])
    p = torch.softmax(masked_logits(logits, torch.tensor([True, True, False])), 0)
    assert p[2] == 0 and p.sum() == pytest.approx(1.0)
    torch.manual_seed(0)
    wild = PolicyNet()
    for prm in wild.parameters():
        torch.nn.init.normal_(prm, std=3.0)  # an arbitrary policy: legality must not care
    g = random_graph(120, 5)
    obj = h100_objective()
    gen = torch.Generator().manual_seed(1)
    for greedy in (True, False):
        ep = rollout(g, obj, wild, greedy=greedy, generator=gen)
        assert ep.complete and check(ep.partition, obj.limits).ok
        assert ep.total_s <= obj.unfused(g).total_s * (1 + 1e-9)


def test_save_load_round_trip_without_pickle_and_schema_check(tmp_path):
    torch.manual_seed(0)
    net = PolicyNet(hidden=16)
    for prm in net.body[-1].parameters():
        torch.nn.init.normal_(prm)
    npz, meta = save_policy(Policy(net, {"note": "test"}), tmp_path / "p")
    with np.load(npz, allow_pickle=False) as data:
        assert set(data.files) == set(net.state_dict())
    back = load_policy(tmp_path / "p")
    x = torch.rand(7, N_FEATURES)
    assert torch.allclose(back.net(x), net(x)) and back.meta["note"] == "test"
    info = json.loads(meta.read_text())
    info["features"] = info["features"][:-1]
    meta.write_text(json.dumps(info))
    with pytest.raises(FusionPlannerError, match="feature schema"):
        load_policy(tmp_path / "p")
    with pytest.raises(FusionPlannerError, match="train-policy"):
        load_policy(tmp_path / "missing")


def test_policy_gradient_step_moves_the_network():
    g = random_graph(50, 7)
    obj = h100_objective()
    net = PolicyNet()
    gen = torch.Generator().manual_seed(0)
    eps = [rollout(g, obj, net, greedy=False, generator=gen, record=True) for _ in range(4)]
    logp, ent = log_probs(net, eps[0])
    logp, ent = float(logp.detach()), float(ent.detach())
    assert math.isfinite(logp) and logp <= 0 and ent >= 0
    before = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    rewards = [(ep, -math.log(ep.total_s)) for ep in eps]
    reinforce_step(net, opt, [rewards], entropy=1e-2, temperature=1.0)
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))


# ---- the shipped policy ----------------------------------------------------------------------
def test_shipped_policy_has_its_command_corpus_and_scores():
    policy = load_policy(DEFAULT_POLICY)
    meta = policy.meta
    assert meta["command"].startswith("fusion-plan train-policy")
    assert meta["features"] == list(FEATURE_NAMES)
    report = meta["report"]
    assert set(report["corpus"]["held_out_zoo"]) == set(HELD_OUT_ZOO)
    assert not set(HELD_OUT_ZOO) & set(TRAIN_ZOO)
    assert report["stages"][0]["stage"] == "prior"
    assert VALIDATION_SEED > HELD_OUT_SEED


def test_zero_shot_on_unseen_graphs_is_deterministic_legal_and_beats_greedy():
    for g in [random_graph(n, s) for n, s in HELD_OUT] + [zoo_graph(z) for z in HELD_OUT_ZOO[:3]]:
        obj = h100_objective()
        a = get_strategy("rl").plan(g, obj)
        b = get_strategy("rl").plan(g, h100_objective())
        assert a.partition == b.partition and a.complete
        assert check(a.partition, obj.limits).ok
        rules = obj.evaluate(default_partition(g, obj.limits)).total_s
        assert a.total_s <= rules * (1 + 1e-9)


def test_finetuning_never_loses_to_zero_shot_and_respects_the_budget():
    g = random_graph(120, HELD_OUT_SEED + 7)
    policy = load_policy(DEFAULT_POLICY)
    obj = h100_objective()
    out = finetune(policy, g, obj, None, seed=0, max_iters=4, patience=10)
    assert out.total_s <= out.zero_shot_s * (1 + 1e-12) and out.episodes == 1 + 4 * 4
    assert check(out.partition, obj.limits).ok
    r = get_strategy("rl-ft").plan(g, h100_objective(), Budget(max_evals=150), seed=2)
    assert r.evals_used <= 152 and check(r.partition, obj.limits).ok and not r.complete
    r1 = get_strategy("rl-ft", max_iters=3).plan(g, h100_objective(), seed=5)
    r2 = get_strategy("rl-ft", max_iters=3).plan(g, h100_objective(), seed=5)
    assert r1.partition == r2.partition


def test_finetuning_stops_on_seconds_once_every_group_is_memoized():
    """A small graph's groups are all scored after a few episodes; from then on no rollout
    consults the clock, so the loop itself must (the budget contract of search/strategy.py)."""
    import time

    g = zoo_graph("resnet-bottleneck")
    strat = get_strategy("rl-ft", max_iters=100_000, patience=100_000)
    t0 = time.perf_counter()
    r = strat.plan(g, h100_objective(), Budget(max_seconds=0.5), seed=0)
    assert time.perf_counter() - t0 < 5.0 and not r.complete


@pytest.mark.slow
def test_training_runs_end_to_end_and_keeps_the_best_checkpoint(tmp_path):
    cfg = TrainConfig(
        sizes=(8, 16), seeds_per_size=2, rl_iters=4, graphs_per_iter=2, rollouts=3,
        val_sizes=(24,), val_seeds=2, eval_every=2, max_minutes=2,
    )  # fmt: skip
    policy, report = train(cfg)
    assert [s["stage"] for s in report.stages] == ["prior", "reinforce", "reinforce"]
    keys = [s["validation"]["mean_cost_vs_priority"] for s in report.stages]
    assert report.selected_iteration in (0, 2, 4)
    kept = keys[[0, 2, 4].index(report.selected_iteration)]
    assert kept == pytest.approx(min(keys), abs=1e-6)
    save_policy(policy, tmp_path / "p")
    assert (
        load_policy(tmp_path / "p").meta["report"]["selected_iteration"]
        == report.selected_iteration
    )
