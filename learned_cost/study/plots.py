"""Predicted-vs-measured plots drawn from saved points, and the check that ties them to a model.

`cost train` (and `cost eval --plot`) write the held-out points of one split beside the PNG
(`PLOT.points.json`: measured and predicted latency per group row, the family of each row,
and each panel's MAPE and Kendall tau as the run scored them) and draw the PNG from that file
alone (`render_png`). The PNG carries the digest of the points it was drawn from. A plot made
with a saved model names the model file; `problems` then checks that each panel's title
figures are the ones the model's metadata records for that split, the figures
docs/learned_cost.md tabulates, and that the points give those figures again.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from learned_cost.study.evaluate import group_metrics

# Qualitative colours far apart from each other (matplotlib's tab10 and four more); with a
# marker per family too, two families never look alike even where colours are near.
FAMILY_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#000080", "#ff00ff", "#7fff00",
)  # fmt: skip
FAMILY_MARKERS = ("o", "s", "^", "D", "v")
DIGEST_KEY = "Description"  # the PNG text chunk holding the points' digest
DIGITS = 6  # significant digits kept per latency: far below the titles' rounding


def family_styles(families: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(colour, marker) per family, in sorted order: distinct pairs for up to 70 families."""
    out = {}
    for k, fam in enumerate(sorted(set(families))):
        out[fam] = (FAMILY_COLORS[k % len(FAMILY_COLORS)], FAMILY_MARKERS[k % len(FAMILY_MARKERS)])
    return out


def points_path(png: str | Path) -> Path:
    """Where the points of `png` are saved: beside it, `NAME.points.json`."""
    png = Path(png)
    return png.with_name(png.stem + ".points.json")


def _us(values: np.ndarray) -> list[float]:
    return [float(f"{v * 1e6:.{DIGITS}g}") for v in values]


def make_points(sr: Any, title: str, *, model_file: str = "", command: str = "") -> dict:
    """The held-out points of one split (`train.SplitResult`) and each panel's figures."""
    families = sr.cv.design.groups if sr.split == "family" else None
    return {
        "title": f"{title} held-out groups, split by {sr.split}".strip(),
        "split": sr.split,
        "model_file": model_file,
        "command": command,
        "measured_us": _us(sr.cv.design.measured_s),
        "families": [str(f) for f in families] if families is not None else None,
        "panels": [
            {
                "name": name,
                "mape": sr.score(name).groups.mape,
                "kendall_tau": sr.score(name).groups.kendall_tau,
                "predicted_us": _us(sr.cv.predicted_s(name)),
            }
            for name in sr.cv.oof_log_ratio
        ],
    }


def write_points(points: dict, png: str | Path) -> Path:
    path = points_path(png)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(points, separators=(",", ":")) + "\n")
    return path


def digest(points_file: str | Path) -> str:
    return "points sha256 " + hashlib.sha256(Path(points_file).read_bytes()).hexdigest()


def panel_title(panel: dict) -> str:
    return f"{panel['name']}: MAPE {100 * panel['mape']:.1f}%, tau {panel['kendall_tau']:.2f}"


def render_png(png: str | Path) -> Path:
    """Draw `png` from its saved points: one log-log panel per model, families by colour
    and marker, the legend in a panel of its own so it hides no points."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on build machines or the GPU box
    import matplotlib.pyplot as plt

    png = Path(png)
    src = points_path(png)
    pts = json.loads(src.read_text())
    measured = np.array(pts["measured_us"])
    families = np.array(pts["families"], dtype=object) if pts["families"] else None
    styles = family_styles(list(families)) if families is not None else {}
    panels = pts["panels"]
    cols = 3
    rows = math.ceil((len(panels) + (1 if styles else 0)) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 4.0 * rows + 0.4), squeeze=False, layout="constrained"
    )
    lo, hi = measured.min() / 2, measured.max() * 2
    for ax, panel in zip(axes.flat, panels):
        pred = np.array(panel["predicted_us"])
        if families is not None:
            for fam, (color, marker) in styles.items():
                m = families == fam
                ax.scatter(
                    measured[m], pred[m], s=7, alpha=0.6, color=color, marker=marker,
                    linewidths=0, label=fam,
                )  # fmt: skip
        else:
            ax.scatter(measured, pred, s=6, alpha=0.6)
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.9, 1.1):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.5)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
        ax.set_title(panel_title(panel), fontsize=9)
        ax.set_xlabel("measured (us)", fontsize=8)
        ax.set_ylabel("predicted (us)", fontsize=8)
    spare = list(axes.flat)[len(panels) :]
    for ax in spare:
        ax.axis("off")
    if styles:
        handles, labels = axes.flat[0].get_legend_handles_labels()
        spare[0].legend(
            handles, labels, title="model family", loc="center", fontsize=9, markerscale=2.5,
            frameon=False,
        )  # fmt: skip
        for h in spare[0].get_legend().legend_handles:
            h.set_alpha(1.0)
    fig.suptitle(pts["title"], fontsize=12)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, metadata={DIGEST_KEY: digest(src)})
    plt.close(fig)
    return png


def png_digest(png: str | Path) -> str:
    """The points digest a PNG was drawn with ('' when it carries none)."""
    from PIL import Image

    with Image.open(png) as im:
        return str(im.info.get(DIGEST_KEY, ""))


def problems(png: str | Path, root: str | Path = ".") -> list[str]:
    """Why `png` (a path under `root`, as messages name it) does not show what its points and its model's metadata say (empty: it does).

    Checked: the points file exists; the PNG was drawn from it (digest); each panel's title
    figures follow from the points; and, where the points name a saved model, they are the
    model metadata's figures for that split."""
    png, root = Path(png), Path(root)
    full = root / png
    src = points_path(full)
    if not src.is_file():
        return [f"{png} has no saved points ({src.name})"]
    out = []
    if not full.is_file() or png_digest(full) != digest(src):
        out.append(f"{png} was not drawn from {src.name}")
    pts = json.loads(src.read_text())
    measured = np.array(pts["measured_us"])
    for p in pts["panels"]:
        m = group_metrics(np.array(p["predicted_us"]), measured, np.zeros(len(measured)))
        if panel_title({**p, "mape": m.mape, "kendall_tau": m.kendall_tau}) != panel_title(p):
            out.append(f"{src.name}: the points of {p['name']} do not give its title's figures")
    if pts.get("model_file"):
        meta = json.loads((root / pts["model_file"]).read_text())
        rec = meta.get("metrics", {}).get("splits", {}).get(pts["split"], {})
        scores = {s["name"]: s["groups"] for s in rec.get("scores", [])}
        for p in pts["panels"]:
            s = scores.get(p["name"])
            if s is None or panel_title({**p, **s}) != panel_title(p):
                out.append(
                    f"{src.name}: {p['name']}'s title differs from {pts['model_file']}'s "
                    f"held-out-by-{pts['split']} table"
                )
    return out
