"""The RL policy: a small torch network that chooses which fusion merge comes next.

Formulation (docs/formulas.md §13: state = graph features, action = fuse / not fuse, reward =
modelled speedup). An episode is priority's merge process (search/merge_env.py) with the
choices handed to the policy:

1. patterns: for each fused-kernel match (attention, sibling GEMMs) that is legal and
   helps, a Bernoulli apply / skip, p = sigmoid(logit);
2. merges: at each step, the legal candidate merges (pairs of groups sharing an edge or an
   input, with a positive modelled gain) are scored and one is drawn from
   softmax(logits / temperature); illegal merges are masked (-inf: never drawn). The episode
   ends when no legal merge helps, so every episode ends in a local optimum.

reward = log(unfused cost / plan cost), the modelled speedup over one kernel per op.

Features are per merge and scale-free (gain relative to the parts, op-kind mix, roofline
bound and launch share of the merged group, bytes kept on chip, how contested the merge is,
progress), so a policy trained on one corpus plans unseen graphs of any size zero-shot.
Greedy decode (argmax everywhere, ties to the lower group ids) is deterministic.

Weights ship as a state dict in .npz (no pickle) with JSON metadata (feature schema,
training command and corpus, metrics): `save_policy` / `load_policy`. Training and
fine-tuning: search/rl_train.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from planner.errors import FusionPlannerError
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition, bits
from planner.hardware import one_thread
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.encoding import pattern_matches
from search.merge_env import MergeEnv, OutOfBudget
from search.strategy import Clock

POLICY_DIR = Path(__file__).parent / "policies"
DEFAULT_POLICY = POLICY_DIR / "fusion_policy"  # .npz (state dict) + .json (metadata)
SCHEMA_VERSION = 1

# The feature schema: name and why it helps choose a merge. Static ones depend on the
# two groups only (cached per pair); dynamic ones on the other candidates of the step.
# fmt: off
FEATURES: tuple[tuple[str, str], ...] = (
    ("gain_rel", "modelled gain over the parts' cost: how much this merge saves, relatively"),
    ("log_gain", "gain against the graph's median op cost: big merges first, at any scale"),
    ("vertical", "producer-consumer (1) or siblings on one input (0): different risks"),
    ("has_anchor", "a GEMM/conv in the union: takes epilogues, blocks prologues"),
    ("multi_anchor", "two or more anchors: a concatenated GEMM or an attention kernel"),
    ("has_reduce", "a reduction/norm/softmax in the union: limits what may join later"),
    ("has_injective", "copies/cat in the union"),
    ("has_broadcast", "generated or broadcast values in the union"),
    ("size_union", "log2 ops in the union: big groups hit register caps"),
    ("size_small", "log2 ops in the smaller part"),
    ("compute_bound", "the union is compute bound: merging saves launches, not bytes"),
    ("log_cm_ratio", "log10 T_compute / T_memory of the union, clipped"),
    ("launch_share", "launch overhead share of the union's time"),
    ("bytes_saved", "share of the parts' boundary bytes the merge keeps on chip"),
    ("is_pattern", "a fused-kernel pattern decision (1) or a pairwise merge (0)"),
    ("gain_vs_best", "gain over the best legal candidate's gain at this step"),
    ("rank", "rank of the gain among the legal candidates, 0 = best, 1 = worst"),
    ("rival_ratio", "log1p(best rival gain / own gain): rivals share a group with it"),
    ("n_rivals", "log1p(candidates sharing a group with it) / 3"),
    ("progress", "merges done / base units: early or late in the episode"),
)
# fmt: on
FEATURE_NAMES = tuple(name for name, _ in FEATURES)
N_FEATURES = len(FEATURES)
N_STATIC = FEATURE_NAMES.index("gain_vs_best")
GAIN_VS_BEST = FEATURE_NAMES.index("gain_vs_best")
IS_PATTERN = FEATURE_NAMES.index("is_pattern")
RANK = FEATURE_NAMES.index("rank")
TIE_BREAK = 1e-3  # logit units: decides exact ties, invisible to sampling


class PolicyNet(nn.Module):
    """A merge's logit: a fixed prior plus a learned MLP correction.

        logit = prior_scale * log(gain / best gain)   for a merge
              = pattern_prior                         for a pattern decision
                + MLP(features)

    The prior is priority's ordering, tempered: its argmax is priority's choice, and a
    merge with 0.95x the best gain keeps exp(20 log 0.95) = 36% of its weight, so sampled
    episodes explore the close calls where priority can go wrong and nothing else. The MLP
    starts at zero (its last layer is zero-initialized) and REINFORCE trains it: the
    network learns where to depart from the heuristic, not the heuristic itself.
    """

    def __init__(
        self,
        n_features: int = N_FEATURES,
        hidden: int = 64,
        prior_scale: float = 20.0,
        pattern_prior: float = 2.0,
    ):
        super().__init__()
        self.hidden = hidden
        self.body = nn.Sequential(
            nn.Linear(n_features, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, 1),
        )
        nn.init.zeros_(self.body[-1].weight)
        nn.init.zeros_(self.body[-1].bias)
        self.register_buffer("prior_scale", torch.tensor(float(prior_scale)))
        self.register_buffer("pattern_prior", torch.tensor(float(pattern_prior)))

    def prior(self, x: torch.Tensor) -> torch.Tensor:
        is_pattern = x[..., IS_PATTERN]
        ratio = x[..., GAIN_VS_BEST].clamp_min(1e-6)
        # rank (exact, from float64 gains) breaks the ties float32 ratios cannot see
        merge = self.prior_scale * ratio.log() - TIE_BREAK * x[..., RANK]
        return (1 - is_pattern) * merge + is_pattern * self.pattern_prior

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prior(x) + self.body(x).squeeze(-1)


@dataclass(frozen=True)
class Policy:
    """A trained network with its metadata (what it was trained on, how, how well)."""

    net: PolicyNet
    meta: dict[str, Any] = field(default_factory=dict)


def save_policy(policy: Policy, path: str | Path = DEFAULT_POLICY) -> tuple[Path, Path]:
    """Write `path`.npz (state dict, float32 arrays) and `path`.json (metadata)."""
    base = Path(path).with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        k: v.detach().cpu().numpy().astype(np.float32) for k, v in policy.net.state_dict().items()
    }
    np.savez(base.with_suffix(".npz"), **arrays)
    meta = {
        **policy.meta,
        "schema_version": SCHEMA_VERSION,
        "features": list(FEATURE_NAMES),
        "hidden": policy.net.hidden,
        "torch_version": torch.__version__,
    }
    base.with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return base.with_suffix(".npz"), base.with_suffix(".json")


def load_policy(path: str | Path = DEFAULT_POLICY) -> Policy:
    """Load a policy saved by `save_policy`; the feature schema must match this code's."""
    base = Path(path).with_suffix("")
    npz, meta_path = base.with_suffix(".npz"), base.with_suffix(".json")
    if not npz.exists() or not meta_path.exists():
        raise FusionPlannerError(
            f"no trained policy at {base}.npz/.json; train one with "
            "`fusion-plan train-policy` (search/rl_train.py)"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("schema_version") != SCHEMA_VERSION or meta.get("features") != list(FEATURE_NAMES):
        raise FusionPlannerError(
            f"policy {base} was trained on feature schema {meta.get('schema_version')} "
            f"({len(meta.get('features', []))} features), this code expects schema "
            f"{SCHEMA_VERSION} ({N_FEATURES} features); retrain it with `fusion-plan train-policy`"
        )
    net = PolicyNet(N_FEATURES, int(meta["hidden"]))
    with np.load(npz, allow_pickle=False) as data:
        state = {k: torch.from_numpy(np.array(data[k])) for k in data.files}
    net.load_state_dict(state)
    net.eval()
    return Policy(net, meta)


# ---- features ----------------------------------------------------------------------------
class Featurizer:
    """Static features per merge (cached by the masks involved) for one graph."""

    def __init__(self, env: MergeEnv):
        self.env = env
        g = env.graph
        self.kinds = kinds(g)
        roots = sorted(set(env.base))  # base units: each op with the views of its result
        scores = sorted(
            s for s in (env.mask_score(1 << u) for u in roots) if math.isfinite(s) and s > 0
        )
        self.unit_s = scores[len(scores) // 2] if scores else 1e-6
        self.n_units = max(1, len(roots))
        self.cache: dict[tuple[int, ...], np.ndarray] = {}

    def _cost(self, mask: int) -> Any:
        try:
            return self.env.objective.group_cost(self.env.graph, mask)  # scored already: cached
        except Exception:
            return None

    def static(self, masks: tuple[int, ...], gain: float, pattern: bool) -> np.ndarray:
        key = (*masks, int(pattern))
        got = self.cache.get(key)
        if got is not None:
            return got
        env, ks = self.env, self.kinds
        union = 0
        for m in masks:
            union |= m
        parts = sum(env.mask_score(m) for m in masks)
        work = [i for i in bits(union) if ks[i] is not Kind.FREE]
        kind_set = {ks[i] for i in work}
        n_anchor = sum(1 for i in work if ks[i] is Kind.ANCHOR)
        sizes = [sum(1 for i in bits(m) if ks[i] is not Kind.FREE) for m in masks]
        cu = self._cost(union)
        costs = [self._cost(m) for m in masks]
        lr = 0.0
        bound = launch = saved = 0.0
        if cu is not None and cu.latency_s > 0:
            bound = float(cu.t_compute_s >= cu.t_memory_s)
            if cu.t_compute_s > 0 and cu.t_memory_s > 0:
                lr = max(-3.0, min(3.0, math.log10(cu.t_compute_s / cu.t_memory_s))) / 3
            launch = cu.t_launch_s / cu.latency_s
            if all(c is not None for c in costs):
                before = sum(c.bytes_in + c.bytes_out for c in costs)
                after = cu.bytes_in + cu.bytes_out
                saved = (before - after) / before if before > 0 else 0.0
        vertical = 0.0
        if len(masks) == 2:
            a, b = masks
            reach_a = any(env.graph.reach[i] & b for i in bits(a))
            reach_b = any(env.graph.reach[i] & a for i in bits(b))
            vertical = float(reach_a or reach_b)
        finite = math.isfinite(gain) and gain > 0
        x = np.array(
            [
                min(1.0, gain / parts) if finite and parts > 0 and math.isfinite(parts) else 1.0,
                max(-4.0, min(4.0, math.log10(gain / self.unit_s))) / 4 if finite else 1.0,
                vertical,
                float(Kind.ANCHOR in kind_set),
                float(n_anchor >= 2),
                float(Kind.REDUCE in kind_set),
                float(Kind.INJECTIVE in kind_set),
                float(Kind.BROADCAST in kind_set),
                math.log2(1 + len(work)) / 6,
                math.log2(1 + min(sizes)) / 6,
                bound,
                lr,
                launch,
                saved,
                float(pattern),
            ],
            dtype=np.float32,
        )
        self.cache[key] = x
        return x

    def step(self, pairs: list[tuple[int, int]]) -> np.ndarray:
        """Feature rows of the legal candidate merges of this step (`pairs` sorted)."""
        env = self.env
        mask = env.state.mask
        n = len(pairs)
        raw = np.array([env.cands[p] for p in pairs], dtype=np.float64)
        gains = np.where(np.isfinite(raw), raw, np.finfo(np.float32).max)
        rows = np.empty((n, N_FEATURES), dtype=np.float32)
        rows[:, :N_STATIC] = np.stack(
            [
                self.static((mask[a], mask[b]), float(raw[k]), False)
                for k, (a, b) in enumerate(pairs)
            ]
        )
        best = gains.max()
        rank = np.empty(n)
        rank[np.argsort(-gains, kind="stable")] = np.arange(n) / max(1, n - 1)
        # the best other candidate sharing a group with each pair (its "rival")
        ids = {gid: j for j, gid in enumerate(sorted({g for p in pairs for g in p}))}
        side = np.array([[ids[a], ids[b]] for a, b in pairs]).reshape(n, 2)
        both = np.concatenate([side[:, 0], side[:, 1]])
        vals = np.concatenate([gains, gains])
        idx = np.concatenate([np.arange(n), np.arange(n)])
        top1 = np.full(len(ids), -np.inf)
        np.maximum.at(top1, both, vals)
        holder = np.full(len(ids), n)
        at_top = vals >= top1[both]
        np.minimum.at(holder, both[at_top], idx[at_top])
        rest = np.where(idx == holder[both], -np.inf, vals)
        top2 = np.full(len(ids), -np.inf)
        np.maximum.at(top2, both, rest)
        rival = np.zeros(n)
        for col in (0, 1):
            g = side[:, col]
            r = np.where(holder[g] == np.arange(n), top2[g], top1[g])
            rival = np.maximum(rival, np.where(np.isfinite(r), r, 0.0))
        count = np.bincount(both, minlength=len(ids))
        rows[:, N_STATIC] = np.minimum(1.0, gains / best)
        rows[:, N_STATIC + 1] = rank
        rows[:, N_STATIC + 2] = np.minimum(3.0, np.log1p(rival / gains))
        rows[:, N_STATIC + 3] = np.log1p(count[side[:, 0]] + count[side[:, 1]] - 2) / 3
        rows[:, N_STATIC + 4] = env.n_merges / self.n_units
        return rows


# ---- episodes ----------------------------------------------------------------------------
@dataclass
class Episode:
    """One run of the policy on a graph: the plan, its modelled cost, and what was chosen
    (feature rows and choices) for the policy gradient."""

    partition: Partition
    total_s: float
    complete: bool
    merge_steps: list[tuple[np.ndarray, int]] = field(default_factory=list)
    pattern_steps: list[tuple[np.ndarray, int]] = field(default_factory=list)


def masked_logits(logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Illegal actions get -inf: they never receive probability."""
    return logits.masked_fill(~legal, float("-inf"))


def rollout(
    graph: OpGraph,
    objective: Objective,
    net: PolicyNet,
    *,
    greedy: bool,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    clock: Clock | None = None,
    memo: dict[int, float] | None = None,
    record: bool = False,
    teacher: bool = False,
) -> Episode:
    """Run one episode. `greedy`: argmax everywhere (deterministic); else sample with
    `generator`. `teacher`: take priority's choices instead (largest gain, the patterns
    priority applies): the same episode as the priority strategy, the reference training
    scores the policy against. On OutOfBudget the legal partition reached so far comes
    back with complete=False."""
    with one_thread():
        return _rollout(
            graph, objective, net, greedy, generator, temperature, clock, memo, record, teacher
        )


def _rollout(
    graph: OpGraph,
    objective: Objective,
    net: PolicyNet,
    greedy: bool,
    generator: torch.Generator | None,
    temperature: float,
    clock: Clock | None,
    memo: dict[int, float] | None,
    record: bool,
    teacher: bool,
) -> Episode:
    try:  # the first scores (every op alone) may already exhaust the budget
        env = MergeEnv(graph, objective, clock, memo=memo)
        feat = Featurizer(env)
    except OutOfBudget:
        return Episode(Partition.singletons(graph), math.inf, False)
    ep = Episode(env.partition(), env.total_s, False)
    try:
        applied = 0
        for m in pattern_matches(graph, objective, clock):
            nodes = tuple(sorted(m.nodes))
            if m.mask & applied:
                continue
            gain = env.group_gain(nodes)
            if gain is None:  # spans one group, illegal, or does not help
                continue
            gids = sorted({env.state.group_of[i] for i in nodes})
            x = np.zeros(N_FEATURES, dtype=np.float32)
            x[:N_STATIC] = feat.static(tuple(env.state.mask[g] for g in gids), gain, True)
            x[N_STATIC:] = (1.0, 0.0, 0.0, 0.0, 0.0)
            if teacher:
                take = int(m in env_chosen(graph, objective))
            else:
                with torch.no_grad():
                    logit = float(net(torch.from_numpy(x)))
                if greedy:
                    take = int(logit > 0)
                else:
                    p = 1 / (1 + math.exp(-logit / temperature))
                    take = int(torch.rand((), generator=generator).item() < p)
            if record:
                ep.pattern_steps.append((x, take))
            if take and env.apply_group(nodes):
                applied |= m.mask
        env.start()
        while True:
            pairs = env.legal()
            if not pairs:
                break
            rows = feat.step(pairs)
            if teacher:
                choice = min(range(len(pairs)), key=lambda k: (-env.cands[pairs[k]], pairs[k]))
            else:
                with torch.no_grad():
                    logits = net(torch.from_numpy(rows))
                if greedy:
                    choice = int(torch.argmax(logits))  # first maximum: lowest pair on ties
                else:
                    probs = torch.softmax(logits / temperature, dim=0)
                    choice = int(torch.multinomial(probs, 1, generator=generator))
            if record:
                ep.merge_steps.append((rows, choice))
            env.merge(*pairs[choice])
        part = env.finish()
        ep.partition, ep.total_s, ep.complete = part, env.total_s, True
    except OutOfBudget:
        ep.partition, ep.total_s = env.partition(), env.total_s
    return ep


_CHOSEN: dict[tuple[str, str], tuple[Any, ...]] = {}


def env_chosen(graph: OpGraph, objective: Objective) -> tuple[Any, ...]:
    """The matches priority resolves and applies first (the teacher's pattern choices)."""
    key = (graph.key, objective.cost_model_label)
    got = _CHOSEN.get(key)
    if got is None:
        got = tuple(pattern_matches(graph, objective, None, chosen_only=True))
        if len(_CHOSEN) > 512:
            _CHOSEN.clear()
        _CHOSEN[key] = got
    return got


def log_probs(
    net: PolicyNet, ep: Episode, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log pi(choice), sum of entropies) of an episode's recorded choices, with
    gradients: all merge steps in one padded batch."""
    total = torch.zeros(())
    entropy = torch.zeros(())
    if ep.merge_steps:
        xs = [torch.from_numpy(x) for x, _ in ep.merge_steps]
        lengths = torch.tensor([len(x) for x in xs])
        padded = nn.utils.rnn.pad_sequence(xs, batch_first=True)  # [T, N, F]
        legal = torch.arange(padded.shape[1])[None, :] < lengths[:, None]
        logits = masked_logits(net(padded) / temperature, legal)
        logp = torch.log_softmax(logits, dim=1)
        chosen = torch.tensor([c for _, c in ep.merge_steps])
        total = total + logp.gather(1, chosen[:, None]).sum()
        safe = logp.masked_fill(~legal, 0.0)  # 0 * -inf would poison the gradient
        entropy = entropy - (safe.exp() * safe).masked_fill(~legal, 0.0).sum()
    if ep.pattern_steps:
        x = torch.from_numpy(np.stack([x for x, _ in ep.pattern_steps]))
        y = torch.tensor([float(t) for _, t in ep.pattern_steps])
        logit = net(x) / temperature
        total = total - nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="sum")
        p = torch.sigmoid(logit)
        entropy = entropy + nn.functional.binary_cross_entropy_with_logits(
            logit, p, reduction="sum"
        )
    return total, entropy
