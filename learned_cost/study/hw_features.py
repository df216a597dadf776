"""Hardware-level features beside the model's own, compared on the held-out study's folds.

Three feature sets, each fitted by gradient-boosted trees and the MLP (free form: the one
form that reads columns beyond a schema's own) on the seeded architecture folds of
learned_cost.study.heldout (the same folds, seed for seed, as `fusion-plan cost heldout`),
each also with twins:

- the features of schema 5 (learned_cost.features.FEATURES_V5, what the committed models
  read): no suffix;
- those and the descriptor-level features below (`-hw`): each computed from a group's
  descriptor and the device spec;
- schema 6 (`-v6`): schema 5 and the features of learned_cost.features.FEATURES_V6, built
  from the group's ops (per-op traffic, launched kernels, every anchor's tiles and waves,
  reductions), what `cost train` and `cost heldout` fit now.

With `--recapture`, the descriptors are recomputed on today's capture of each row's graph
(as `cost heldout` and `cost train` do); without it they are the ones stored at
collection, which lack the fields of later descriptor versions on older rows (the first
run of this study: the anchor's M, N and K on 5588 of 9150 H100 rows). Run:

    python -m learned_cost.study.hw_features --data data/h100_profiles.parquet --device h100 \
        --seeds 0,1,2 --gbt-trees 60 --mlp-steps 300 --recapture \
        --out benchmarks/results/h100_hw_features.json

(`--mlp-steps 0` leaves the MLP out, as the first run of this study did.)
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from learned_cost.data import descriptor_of, group_rows, load_profiles
from learned_cost.features import FEATURE_NAMES, FEATURES_V5, design_matrix
from learned_cost.mlp import CorrectionMLP
from learned_cost.study.baselines import GBTCorrection
from learned_cost.study.evaluate import group_metrics
from learned_cost.study.heldout import shuffled_group_folds, with_split_keys
from learned_cost.study.plan_eval import GraphCache, current_descriptors
from learned_cost.twins import TwinTable
from planner.hardware import DeviceSpec, get_spec

TILE_MN, TILE_K = 128, 64  # a typical tensor-core GEMM tile (CUTLASS/cuBLAS 128x128x64)


def _tiles(desc: Mapping[str, Any]) -> tuple[int, int, int]:
    m, n, k = (int(desc.get(f"anchor_{a}") or 0) for a in "mnk")
    return m, n, k


def _gemm_tiles(desc: Mapping[str, Any]) -> int:
    m, n, _ = _tiles(desc)
    return math.ceil(m / TILE_MN) * math.ceil(n / TILE_MN) if m and n else 0


def _wave_fill(desc: Mapping[str, Any], spec: DeviceSpec) -> float:
    t = _gemm_tiles(desc)
    return t / (math.ceil(t / spec.sm_count) * spec.sm_count) if t else 0.0


def _padded_over_useful(desc: Mapping[str, Any]) -> float:
    m, n, k = _tiles(desc)
    if not (m and n and k):
        return 0.0
    pad = (
        math.ceil(m / TILE_MN)
        * TILE_MN
        * math.ceil(n / TILE_MN)
        * TILE_MN
        * math.ceil(k / TILE_K)
        * TILE_K
    )
    return math.log10(pad / (m * n * k))


def _traffic(desc: Mapping[str, Any]) -> float:
    return float(desc.get("bytes_in") or 0) + float(desc.get("bytes_out") or 0)


# (name, fn(descriptor, spec), why)
HW_FEATURES: tuple[tuple[str, Callable[[Mapping[str, Any], DeviceSpec], float], str], ...] = (
    (
        "log_kernels",
        lambda d, s: math.log1p(float(d.get("n_kernels") or 0)),
        "launch count: each kernel pays a launch and its own pass over memory",
    ),
    (
        "bytes_per_kernel",
        lambda d, s: math.log10(_traffic(d) / max(float(d.get("n_kernels") or 1), 1.0) + 1.0),
        "per-kernel traffic: a kernel moving little never reaches the bandwidth roof",
    ),
    (
        "kernel_bytes_over_l2",
        lambda d, s: math.log10(
            _traffic(d) / max(float(d.get("n_kernels") or 1), 1.0) / s.l2_bytes + 1e-6
        ),
        "per-kernel traffic against the L2: what a kernel streams from DRAM or reuses",
    ),
    (
        "gemm_m_fill",
        lambda d, s: (
            _tiles(d)[0] / (math.ceil(_tiles(d)[0] / TILE_MN) * TILE_MN) if _tiles(d)[0] else 0.0
        ),
        "tile fill along M: a GEMM of 130 rows pays for 256",
    ),
    (
        "gemm_k_fill",
        lambda d, s: (
            _tiles(d)[2] / (math.ceil(_tiles(d)[2] / TILE_K) * TILE_K) if _tiles(d)[2] else 0.0
        ),
        "the last k-tile's fill: a short or odd K wastes part of every tile",
    ),
    (
        "gemm_wave_fill",
        _wave_fill,
        "wave quantization from the anchor's own M x N tiles over the SMs",
    ),
    (
        "gemm_log_waves",
        lambda d, s: math.log10(math.ceil(_gemm_tiles(d) / s.sm_count) + 1),
        "how many waves of tiles: one partial wave costs a whole one",
    ),
    (
        "gemm_padded_over_useful",
        lambda d, s: _padded_over_useful(d),
        "tile-padded work over useful work (log10): what tile quantization costs",
    ),
)
HW_NAMES = tuple(n for n, _, _ in HW_FEATURES)


def hw_matrix(rows: Sequence[Mapping[str, Any]], spec: DeviceSpec) -> np.ndarray:
    """The HW_FEATURES of each row (desc_* columns), one row per row."""
    return np.array(
        [[fn(descriptor_of(r), spec) for _, fn, _ in HW_FEATURES] for r in rows], dtype=np.float64
    ).reshape(len(rows), len(HW_FEATURES))


def compare(
    rows: Sequence[Mapping[str, Any]],
    spec: DeviceSpec,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    n_splits: int = 5,
    gbt_params: Mapping[str, Any] | None = None,
    mlp_params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """gbt and gbt+twins (and, with `mlp_params`, mlp-free and mlp-free+twins with those
    settings) on schema 5's features, with HW_FEATURES appended (-hw) and on schema 6's
    (-v6), on the architecture folds of each seed; twins are looked up on schema 5's
    features for the first two (the same rows answer), on schema 6's for -v6 (as a model
    of that schema looks them up)."""
    rows = with_split_keys(rows)
    v5 = tuple(n for n, _, _ in FEATURES_V5)
    d = design_matrix(rows, lambda _n: spec, group_by="architecture", names=v5)
    X6 = design_matrix(rows, lambda _n: spec, group_by="architecture", names=FEATURE_NAMES).X
    H = hw_matrix(rows, spec)
    XH = np.hstack([d.X, H])
    sets = (("", d.X), ("-hw", XH), ("-v6", X6))
    graphs = np.array([str(r.get("graph_key")) for r in rows], dtype=object)
    out: dict[str, Any] = {"n_rows": len(rows), "features": list(HW_NAMES), "seeds": []}
    for seed in seeds:
        bases = ("gbt", "mlp-free") if mlp_params is not None else ("gbt",)
        names = [f"{b}{h}{t}" for b in bases for h, _ in sets for t in ("", "+twins")]
        logr = {n: np.zeros(len(d)) for n in names}
        has_twin = np.zeros(len(d), dtype=bool)
        for tr, te in shuffled_group_folds(seed)(d.groups, n_splits):
            table = TwinTable.fit(d.X[tr], d.y[tr])
            table6 = TwinTable.fit(X6[tr], d.y[tr])
            has_twin[te] = table.lookup(d.X[te])[1]
            for name, X in ((f"{b}{h}", M) for b in bases for h, M in sets):
                if name.startswith("gbt"):
                    est = GBTCorrection(random_state=seed).set_params(**(gbt_params or {}))
                else:
                    est = CorrectionMLP(form="free", random_state=seed, **(mlp_params or {}))
                est.fit(X[tr], d.y[tr])
                logr[name][te] = est.predict(X[te])
                t, Xt = (table6, X6) if name.endswith("-v6") else (table, d.X)
                logr[f"{name}+twins"][te] = t.answer(Xt[te], logr[name][te])
        lone = ~has_twin
        rec = {"seed": seed, "twin_share": float(has_twin.mean()), "scores": {}}
        for name, r in logr.items():
            pred = d.analytical_s * np.exp(r)
            rec["scores"][name] = {
                "groups": asdict(group_metrics(pred, d.measured_s, graphs)),
                "groups_no_twin": asdict(
                    group_metrics(pred[lone], d.measured_s[lone], graphs[lone])
                ),
            }
        out["seeds"].append(rec)
    return out


def render(result: Mapping[str, Any]) -> str:
    names = list(result["seeds"][0]["scores"])
    lines = []
    if any(n.endswith("-v6") for n in names):
        lines += [
            "No suffix: the features of schema 5 (what the committed models read); `-hw`: "
            "those and the descriptor-level features above; `-v6`: schema 6, schema 5 and "
            "learned_cost.features.FEATURES_V6 (per-op traffic, launched kernels, every "
            "anchor's tiles and waves, tile padding, reductions), built from the group's ops. "
            + (
                "Descriptors recomputed on today's capture of each row's graph."
                if result.get("recaptured")
                else "Descriptors as stored at collection."
            ),
            "",
        ]
    lines += [
        "| model | MAPE | tau (within graph) | MAPE, rows without a twin | tau within, no twin |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        cells = []
        for part, key, pct in (
            ("groups", "mape", True),
            ("groups", "kendall_tau_within", False),
            ("groups_no_twin", "mape", True),
            ("groups_no_twin", "kendall_tau_within", False),
        ):
            v = np.array([s["scores"][n][part][key] for s in result["seeds"]])
            sd = float(v.std(ddof=1)) if len(v) > 1 else 0.0
            cells.append(
                f"{100 * v.mean():.1f}% ± {100 * sd:.1f}" if pct else f"{v.mean():.3f} ± {sd:.3f}"
            )
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", action="append", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--gbt-trees", type=int, default=None)
    p.add_argument(
        "--mlp-steps",
        type=int,
        default=0,
        help="also the free-form MLP with this many steps (hidden 128,128, no dropout, one "
        "member, as the committed held-out study); 0: gbt only",
    )
    p.add_argument(
        "--recapture",
        action="store_true",
        help="recompute each row's descriptor on today's capture of its graph (as `cost "
        "heldout` does); default: the descriptors stored at collection",
    )
    p.add_argument("--out", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    spec = get_spec(args.device)
    rows = group_rows(load_profiles(args.data), device=spec.name)
    if args.recapture:
        rows = current_descriptors(rows, GraphCache())
    params = {"n_estimators": args.gbt_trees} if args.gbt_trees else {}
    seeds = tuple(int(s) for s in args.seeds.split(","))
    mlp = (
        {"steps": args.mlp_steps, "hidden": (128, 128), "dropout": 0.0, "n_members": 1}
        if args.mlp_steps > 0
        else None
    )
    result = compare(
        rows, spec, seeds=seeds, n_splits=args.folds, gbt_params=params, mlp_params=mlp
    )
    result["mlp_params"] = mlp
    result["recaptured"] = args.recapture
    result["command"] = shlex.join(["python", "-m", "learned_cost.study.hw_features", *argv])
    text = render(result)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
