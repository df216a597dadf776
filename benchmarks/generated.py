"""Every generated results file and generated block of a document, with its generator.

    PYTHONPATH=. python benchmarks/generated.py            # rewrite every stale one
    PYTHONPATH=. python benchmarks/generated.py --check    # list stale ones, exit 1 if any
    PYTHONPATH=. python benchmarks/generated.py --slow     # the slow entries too (minutes)

Each entry re-renders from committed artifacts only (JSON lines, Parquet, saved models,
other generated files) or recomputes a seeded CPU result (docs/accuracy_figures.py): no
device, no timing, seconds. tests/test_generated.py runs the
check, so a committed table that no longer matches its artifact fails the default suite.
An entry marked slow (minutes: it recaptures and plans every graph of a dataset) is
checked by the slow tests and by `--slow` only.

A generated block is the text between `<!-- generated:NAME -->` and
`<!-- /generated:NAME -->` in a document; docs quote measured numbers only inside them
(tests/test_doc_figures.py fails on a figure typed into the prose outside them).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Generated:
    """A whole file (`block` empty) or one named block of a file, and how to render it."""

    path: str  # relative to the repository root
    render: Callable[[], str]
    command: str  # what a person runs to regenerate it by hand
    block: str = ""
    slow: bool = False  # minutes, not seconds: checked by the slow tests only


# Each renderer imports its generator when it runs: checking one entry loads only the
# modules that entry needs.
def _e2e(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import e2e

        return e2e.render_jsonl(RESULTS / f"{name}.jsonl")

    return render


def _stream(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import runtime_stream

        return runtime_stream.render_jsonl(RESULTS / f"{name}.jsonl")

    return render


def _stream_summary(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import runtime_stream

        return runtime_stream.summary_jsonl(RESULTS / f"{name}.jsonl")

    return render


# `--repeats` runs: each aggregate's path without its suffix (its rounds are beside it)
ROUNDS = (
    "runtime_stream_gpt2_rounds_h200/runtime_stream_gpt2_rounds_h200",
    "runtime_stream_gpt2_handout_h200/runtime_stream_gpt2_handout_h200",
    "runtime_stream_llama_rounds_h200/runtime_stream_llama_rounds_h200",
)

# Runs whose contender processes say how the host's pace moves between processes
HOST_PACE_RUNS = (
    "runtime_stream_gpt2_tuned_h200_x",
    "runtime_stream_gpt2_tuned_h200_p",
    "runtime_stream_gpt2_tuned_h200_q",
    "runtime_stream_gpt2_tuned_h200_r",
    "runtime_stream_gpt2_tuned_h200_t",
    "host_pace_h200/stream_cpu_1",
    "host_pace_h200/stream_cpu_2",
    "host_pace_h200/stream_cpu_3",
)


def _over_runs(render: str, names: Sequence[str]) -> Callable[[], str]:
    """A runtime_stream table (`render`, a function of paths) over several committed runs."""

    def run() -> str:
        from benchmarks import runtime_stream

        return getattr(runtime_stream, render)([RESULTS / f"{n}.jsonl" for n in names])

    return run


# Runs on the H200s whose contenders include the planner and an alternative, in order
SERVING_TARGET_RUNS = (
    "runtime_stream_gpt2_tuned_h200_x",
    "runtime_stream_llama_tuned_h200_x",
    "runtime_stream_gpt2_tuned_h200_p",
    "runtime_stream_gpt2_tuned_h200_q",
    "runtime_stream_gpt2_tuned_h200_r",
    "runtime_stream_gpt2_tuned_h200_t",
    *(f"{ROUNDS[0]}_r{k}" for k in (1, 2)),
    *(f"{ROUNDS[1]}_r{k}" for k in (1, 2, 3)),
    "runtime_stream_llama_handout_h200",
    *(f"{ROUNDS[2]}_r{k}" for k in (1, 2)),
    "runtime_stream_gpt2_max_h200",
    "runtime_stream_gpt2_modes_h200",
    "runtime_stream_bert_h200",
)


def _arch_sweep(name: str) -> Callable[[], str]:
    """An architecture sweep's table, from its rows (benchmarks/arch_sweep.py)."""

    def render() -> str:
        from benchmarks import arch_sweep

        return arch_sweep.render(arch_sweep.read_rows(RESULTS / f"{name}.jsonl"), name)

    return render


def _real_rows() -> str:
    """The real-model rows as training architectures: the probe's committed runs."""
    import importlib

    probe = importlib.import_module("benchmarks.probes.heldout_subsets")
    return probe.render_text(ROOT / "learned_cost" / "studies" / "real_rows")


def _rounds(name: str, title: bool) -> Callable[[], str]:
    """A `--repeats` run's comparison of its rounds, from the rounds' JSON lines."""

    def render() -> str:
        from benchmarks import runtime_stream

        rows = (RESULTS / f"{name}.jsonl").read_text().splitlines()
        rounds = json.loads(rows[0])["rounds"]
        folder = (RESULTS / name).parent
        return runtime_stream.rounds_text([folder / r for r in rounds], title=title)

    return render


def _raw(module: str, name: str) -> Callable[[], str]:
    """A results file rendered from the raw rows saved beside it (benchmarks/raw_rows.py)."""

    def render() -> str:
        import importlib

        from benchmarks import raw_rows

        return importlib.import_module(f"benchmarks.{module}").render(
            raw_rows.load(RESULTS / f"{name}.json")
        )

    return render


def _raw_cmd(module: str, name: str) -> str:
    return (
        f"python benchmarks/{module}.py --from-json benchmarks/results/{name}.json "
        f"> benchmarks/results/{name}.md"
    )


RAW_ROWS = (
    ("planning_time", "planning_time"),
    ("lookup_latency", "lookup_latency_cpu"),
    ("mlp_sweep", "mlp_sweep_cpu"),
    ("search_quality", "search_quality"),
    ("search_quality", "encoding_study"),
)


def _real_models_html(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import real_models

        rows = real_models.read_jsonl(RESULTS / f"{name}.jsonl")
        return real_models.html_view(rows, rows[-1].get("command", "") if rows else "")

    return render


def _real_models(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import real_models

        rows = real_models.read_jsonl(RESULTS / f"{name}.jsonl")
        return real_models.markdown(rows, rows[-1].get("command", "") if rows else "")

    return render


def _distributed(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import distributed_gpu

        return distributed_gpu.render_jsonl(RESULTS / name / "results.jsonl")

    return render


def _tp_graph(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import tp_graph_gpu
        from benchmarks.distributed_gpu import load_rows

        return tp_graph_gpu.markdown(load_rows(RESULTS / name / "tp_graph.jsonl"))

    return render


def _search_measured(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import search_measured

        return search_measured.render_jsonl(RESULTS / name / "search_measured.jsonl")

    return render


HELDOUT_PLANS = (
    "compare --data data/h100_profiles.parquet --data data/h100_heldout.parquet "
    "--plans data/h100_heldout_plans.json --retime data/h100_plan_retime.parquet"
)


def _heldout_plans() -> str:
    """Recaptures every graph of the H100 data and plans it again (a few minutes)."""
    import os
    import warnings

    from benchmarks import heldout_plans

    here = os.getcwd()
    os.chdir(ROOT)  # the table names its files relative to the repository
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return heldout_plans.render(heldout_plans.parser().parse_args(HELDOUT_PLANS.split()))
    finally:
        os.chdir(here)


def _plan_additivity() -> str:
    """Recaptures the H100 graphs and cross-validates plan-level models (minutes)."""
    import contextlib
    import io
    import os
    import warnings

    from benchmarks import plan_additivity
    from learned_cost.data import load_profiles

    data = "data/h100_profiles.parquet"
    prof = load_profiles([str(ROOT / data)])
    buf = io.StringIO()
    here = os.getcwd()
    os.chdir(ROOT)  # the result names its file relative to the repository
    try:
        with contextlib.redirect_stdout(buf), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan_additivity.main([data, "--residual"])
    finally:
        os.chdir(here)
    return (
        f"# PYTHONPATH=. python benchmarks/plan_additivity.py {data} --residual\n"
        f"# (this machine's CPU; {data} at hash {prof.data_hash}, {len(prof.rows)} rows)\n"
        + buf.getvalue()
    )


def _recapture() -> str:
    """Recaptures every graph of every committed dataset (a few minutes)."""
    import os

    from benchmarks import recapture

    here = os.getcwd()
    os.chdir(ROOT)  # the table names its files relative to the repository
    try:
        return recapture.table(
            sorted(str(p.relative_to(ROOT)) for p in (ROOT / "data").glob("*.parquet"))
        )
    finally:
        os.chdir(here)


def _learned_cost_doc() -> str:
    from cli.commands.cost import (
        STUDIES_DIR,
        committed_adapt_studies,
        committed_external,
        committed_hw_studies,
        read_meta,
        render_report,
    )
    from learned_cost.study.heldout_report import read_study
    from search.cost_models import COMMITTED_DIR

    metas = [(str(p.relative_to(ROOT)), read_meta(p)) for p in sorted(COMMITTED_DIR.glob("*.json"))]
    studies = [
        (str(p.relative_to(ROOT)), read_study(str(p))) for p in sorted(STUDIES_DIR.glob("*.json"))
    ]
    adapt = committed_adapt_studies(ROOT)
    external = committed_external(ROOT)
    return render_report(
        metas,
        studies,
        root=ROOT,
        adapt_studies=adapt,
        external=external,
        hw_studies=committed_hw_studies(ROOT),
    )


def _section(name: str, heading: str) -> Callable[[], str]:
    """The body of one `## heading` section of a results file, verbatim (blank lines at
    its ends dropped)."""

    def render() -> str:
        text = (RESULTS / f"{name}.md").read_text()
        m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        if m is None:
            raise ValueError(f"benchmarks/results/{name}.md has no section '## {heading}'")
        return m.group(1).strip("\n") + "\n"

    return render


def _tables(name: str) -> Callable[[], str]:
    """Every table row of a results file, verbatim."""

    def render() -> str:
        text = (RESULTS / f"{name}.md").read_text()
        return "\n".join(line for line in text.splitlines() if line.startswith("|")) + "\n"

    return render


def _policy_record() -> str:
    """The shipped RL policy's training record (search/policies/fusion_policy.json):
    what ran, and validation cost relative to priority at every checkpoint."""
    import json

    meta = json.loads((ROOT / "search" / "policies" / "fusion_policy.json").read_text())
    rep = meta["report"]
    stages = rep["stages"]
    graphs = stages[0]["validation"]["graphs"]
    lines = [
        f"`{meta['command']}`: {rep['seconds']:.0f} s, {rep['config']['rl_iters']} REINFORCE "
        f"iterations, {rep['corpus']['graphs']} corpus graphs; selected checkpoint: iteration "
        f"{rep['selected_iteration']}. Greedy decode on the {graphs} validation DAGs, cost "
        "relative to priority (mean over the graphs; lower is better):",
        "",
        "| iteration | stage | mean cost vs priority | better than priority | worse |",
        "|---|---|---|---|---|",
    ]
    for st in stages:
        v = st["validation"]
        lines.append(
            f"| {st['iteration']} | {st['stage']} | {v['mean_cost_vs_priority']:.4f} "
            f"| {v['better_than_priority']} | {v['worse_than_priority']} |"
        )
    return "\n".join(lines) + "\n"


def _data_summary() -> str:
    """Per committed profile dataset (data/*.parquet): rows by kind, graphs, models,
    failed rows."""
    import pyarrow.parquet as pq

    lines = [
        "| file | rows | group rows | plan rows | graphs | zoo families | failed rows |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted((ROOT / "data").glob("*.parquet")):
        t = pq.read_table(path, columns=["kind", "model", "graph_key", "ok"]).to_pydict()
        kinds = t["kind"]
        lines.append(
            f"| `{path.name}` | {len(kinds)} | {kinds.count('group')} | {kinds.count('plan')} "
            f"| {len(set(t['graph_key']))} | {len(set(t['model']))} "
            f"| {sum(not ok for ok in t['ok'])} |"
        )
    return "\n".join(lines) + "\n"


def _accuracy(table: str) -> Callable[[], str]:
    def render() -> str:
        from docs import accuracy_figures

        return getattr(accuracy_figures, table)()

    return render


def _comm_cpu() -> str:
    from benchmarks import comm_alpha_beta

    return comm_alpha_beta.render(RESULTS / "comm_alpha_beta_cpu.json")


def _comm_cpu_runs() -> str:
    from benchmarks import comm_alpha_beta

    names = ("comm_alpha_beta_cpu", "comm_alpha_beta_cpu_p2_run2", "comm_alpha_beta_cpu_p2_q20")
    return comm_alpha_beta.render_runs([RESULTS / f"{n}.json" for n in (*names, *COMM_LOW_Q)])


# runs of `python benchmarks/comm_alpha_beta.py` with its low-quantile default
COMM_LOW_Q = ("comm_alpha_beta_cpu_q05_run1", "comm_alpha_beta_cpu_q05_run2")


def _comm_cpu_low_q() -> str:
    from benchmarks import comm_alpha_beta

    return comm_alpha_beta.render_low_quantile([RESULTS / f"{n}.json" for n in COMM_LOW_Q])


# the same command after each repetition became its minimum over the ranks, with bridges
COMM_MIN_RANK = tuple(f"comm_alpha_beta_cpu_minrank_run{i}" for i in (1, 2, 3))


def _comm_cpu_min_rank() -> str:
    from benchmarks import comm_alpha_beta

    return comm_alpha_beta.render_low_quantile([RESULTS / f"{n}.json" for n in COMM_MIN_RANK])


PIPELINE_GLOO_RUNS = ("pipeline_gloo_cpu", "pipeline_gloo_cpu_run2", "pipeline_gloo_cpu_run3")


def _pipeline_gloo() -> str:
    from benchmarks import pipeline_gloo

    return pipeline_gloo.render_runs([RESULTS / f"{n}.json" for n in PIPELINE_GLOO_RUNS])


def _dp_cpu() -> str:
    from benchmarks import dp_bucket

    return dp_bucket.render(RESULTS / "dp_bucket_cpu_b8_copies_run2.json")


def _dp_cpu_runs() -> str:
    from benchmarks import dp_bucket

    names = ("dp_bucket_cpu_b8", *_DP_WRAPPED)
    return dp_bucket.render_runs([RESULTS / f"{n}.json" for n in names])


# the dp_bucket runs whose DDP copies were built by wrap_ddp
_DP_WRAPPED = (
    "dp_bucket_cpu_b8_wrap",
    "dp_bucket_cpu_b8_wrap_run2",
    "dp_bucket_cpu_b8_copies",
    "dp_bucket_cpu_b8_copies_run1",
    "dp_bucket_cpu_b8_copies_run2",
    "dp_bucket_cpu_b8_serial",  # the first with the search on the serial step model
    "dp_bucket_cpu_b8_bwd",  # the first with the measured backward beside the estimate
)


def _dp_cpu_serial() -> str:
    from benchmarks import dp_bucket

    return dp_bucket.render(RESULTS / "dp_bucket_cpu_b8_serial.json")


def _dp_cpu_bwd() -> str:
    from benchmarks import dp_bucket

    return dp_bucket.render(RESULTS / "dp_bucket_cpu_b8_bwd.json")


def _dp_cpu_summary() -> str:
    from benchmarks import dp_bucket

    return dp_bucket.render_summary([RESULTS / f"{n}.json" for n in _DP_WRAPPED])


def _dp_cpu_earlier() -> str:
    from benchmarks import dp_bucket

    return dp_bucket.render_earlier(
        [RESULTS / f"{n}.json" for n in ("dp_bucket_cpu", "dp_bucket_cpu_b4")]
    )


def _shared_compiles(name: str, title: bool = True) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import shared_compiles

        return shared_compiles.render_json(RESULTS / f"{name}.json", title)

    return render


SHARED_COMPILES = (
    "shared_compiles_cpu",
    "shared_compiles_cpu_nocache",
    "shared_compiles_cpu_dynamic",
)


def _stream_cmd(name: str) -> str:
    return f"python benchmarks/runtime_stream.py --from-jsonl benchmarks/results/{name}.jsonl"


def _generate(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import generate

        return generate.render_jsonl(RESULTS / f"{name}.jsonl")

    return render


def _doc_figure(name: str, *args: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import doc_figures

        return getattr(doc_figures, name)(*args)

    return render


def _quoted(name: str, patterns: tuple[str, ...], fenced: bool = False) -> Callable[[], str]:
    def render() -> str:
        from benchmarks import doc_figures

        return doc_figures.quoted_lines(f"benchmarks/results/{name}", patterns, fenced)

    return render


# The lines of two results files that docs/design_notes.md quotes (regular expressions).
PLAN_ADDITIVITY_LINES = (
    r"plans have every group",
    r"error: mean",
    r"oracle regret",
    r"^\s+mlp\s",
)
HELDOUT_PLANS_LINES = (
    r"^\d+ graphs where",
    r"^Re-timed",
    r"^Plan-level",
    r"^- priority under",
)

# (block, first, second): `benchmarks/timing_noise.py FIRST SECOND` quoted in design_notes.md
TIMING_NOISE = (
    ("timing_noise_recheck", "data/h100_recheck.parquet", "data/h100_profiles.parquet"),
    ("timing_noise_recheck2", "data/h100_recheck2.parquet", "data/h100_profiles.parquet"),
    (
        "timing_noise_repeatability",
        "data/h100_repeatability/collect2.parquet",
        "data/h100_repeatability/collect1.parquet",
    ),
    (
        "timing_noise_v3_v2",
        "data/h100_profiles.parquet",
        "data/h100_repeatability/collect1.parquet",
    ),
)


GENERATED: tuple[Generated, ...] = (
    *(
        Generated(f"benchmarks/results/{n}.md", _generate(n), "python benchmarks/generated.py")
        for n in ("generate_h100", "generate_gpt2_h100", "generate_llama_h100")
    ),
    *(
        Generated(
            f"benchmarks/results/{n}.md",
            _e2e(n),
            f"python benchmarks/e2e.py --from-jsonl benchmarks/results/{n}.jsonl",
        )
        for n in ("e2e_h100", "e2e_h100_20261123")
    ),
    *(
        Generated(f"benchmarks/results/{n}.md", _stream(n), _stream_cmd(n))
        for n in (
            "runtime_stream_cpu",
            "runtime_stream_h100",
            "runtime_stream_tuned_h100",
            "runtime_stream_gpt2_tuned_h200",
            "runtime_stream_gpt2_tuned_h100",
            "runtime_stream_gpt2_tuned_h100_b",
            "runtime_stream_gpt2_tuned_h100_c",
            "runtime_stream_gpt2_tuned_h100_d",
            "runtime_stream_gpt2_tuned_h100_e",
            "runtime_stream_gpt2_tuned_h100_f",
            "runtime_stream_gpt2_tuned_h100_g",
            "runtime_stream_gpt2_tuned_h100_all",
            "runtime_stream_gpt2_tuned_h100_h",
            "runtime_stream_gpt2_tuned_h100_t",
            "runtime_stream_gpt2_tuned_h100_u",
            "runtime_stream_gpt2_tuned_h100_v",
            "runtime_stream_gpt2_tuned_h100_w1",
            "runtime_stream_gpt2_tuned_h100_w2",
            *SERVING_TARGET_RUNS,
            *(f"host_pace_h200/stream_cpu_{k}" for k in (1, 2, 3)),
            *(
                f"runtime_stream_gpt2_ab_h100/stream_{n}"
                for n in ("1_auto", "2_never", "3_auto", "4_never", "5_ro")
            ),
            *(
                f"runtime_stream_gpt2_gc_h100/stream_{n}"
                for n in ("1_gc_on", "2_gc_freeze", "3_gc_on", "4_ro")
            ),
        )
    ),
    Generated(
        "benchmarks/results/real_models_h100.md",
        _real_models("real_models_h100"),
        "python benchmarks/real_models.py --from-jsonl benchmarks/results/real_models_h100.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h100.md",
        _real_models("real_models_bucket_h100"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h100.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h100.html",
        _real_models_html("real_models_bucket_h100"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h100.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h100_earlier.md",
        _real_models("real_models_bucket_h100_earlier"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h100_earlier.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h100_diag.md",
        _real_models("real_models_bucket_h100_diag"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h100_diag.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h100_022c30f.md",
        _real_models("real_models_bucket_h100_022c30f"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h100_022c30f.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h100_5a3c307.md",
        _real_models("real_models_bucket_h100_5a3c307"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h100_5a3c307.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h100_390e764.md",
        _real_models("real_models_bucket_h100_390e764"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h100_390e764.jsonl",
    ),
    Generated(
        "benchmarks/results/real_models_bucket_h200.md",
        _real_models("real_models_bucket_h200"),
        "python benchmarks/real_models.py --from-jsonl "
        "benchmarks/results/real_models_bucket_h200.jsonl",
    ),
    *(
        Generated(
            f"benchmarks/results/{n}/results.md",
            _distributed(n),
            f"python benchmarks/distributed_gpu.py --table-only --out benchmarks/results/{n}",
        )
        for n in (
            "distributed_h200x2",
            "distributed_h200x2_run2",
            "distributed_h200x2_run3",
            "distributed_h200x2_run4",
            "distributed_h200x2_run5",
            "distributed_h200x2_run6a",
            "distributed_h200x2_run6b",
            "distributed_h200x2_run7a",
            "distributed_h200x2_run7b",
            "distributed_h200x2_run8a",
            "distributed_h200x2_run8b",
            "distributed_h200x2_run9a",
            "distributed_h200x2_run9b",
        )
    ),
    Generated(
        "benchmarks/results/tp_graph_h200x2/tp_graph.md",
        _tp_graph("tp_graph_h200x2"),
        "python benchmarks/tp_graph_gpu.py --table-only --out benchmarks/results/tp_graph_h200x2",
    ),
    # every measured search-quality run committed as benchmarks/results/search_measured_*/
    *(
        Generated(
            f"benchmarks/results/{d.name}/search_measured.md",
            _search_measured(d.name),
            f"python benchmarks/search_quality.py --render-measured benchmarks/results/{d.name}",
        )
        for d in sorted(RESULTS.glob("search_measured_*"))
        if (d / "search_measured.jsonl").exists()
    ),
    *(Generated(f"benchmarks/results/{n}.md", _raw(m, n), _raw_cmd(m, n)) for m, n in RAW_ROWS),
    *(
        Generated(
            f"benchmarks/results/{n}.md",
            _shared_compiles(n),
            f"python benchmarks/shared_compiles.py --from-json benchmarks/results/{n}.json",
        )
        for n in SHARED_COMPILES
    ),
    Generated("docs/learned_cost.md", _learned_cost_doc, "fusion-plan cost report"),
    Generated(
        "benchmarks/results/heldout_plans_h100.md",
        _heldout_plans,
        f"python benchmarks/heldout_plans.py {HELDOUT_PLANS} "
        "> benchmarks/results/heldout_plans_h100.md",
        slow=True,
    ),
    # Blocks of hand-written documents that quote measured figures.
    Generated(
        "docs/runtime.md",
        _tables("lookup_latency_cpu"),
        "python benchmarks/generated.py",
        block="lookup_latency_cpu",
    ),
    *(
        Generated("docs/runtime.md", _stream_summary(n), "python benchmarks/generated.py", block=n)
        for n in (
            "runtime_stream_h100",
            "runtime_stream_tuned_h100",
            "runtime_stream_gpt2_tuned_h100_all",
            "runtime_stream_gpt2_tuned_h100_h",
            "runtime_stream_gpt2_tuned_h100_t",
            "runtime_stream_gpt2_tuned_h100_u",
            "runtime_stream_gpt2_tuned_h100_v",
            "runtime_stream_gpt2_tuned_h100_w1",
            "runtime_stream_gpt2_tuned_h100_w2",
            "runtime_stream_gpt2_tuned_h200_x",
            "runtime_stream_llama_tuned_h200_x",
            "runtime_stream_gpt2_tuned_h200_p",
            "runtime_stream_gpt2_tuned_h200_q",
            "runtime_stream_gpt2_tuned_h200_r",
            "runtime_stream_gpt2_tuned_h200_t",
            "runtime_stream_llama_handout_h200",
            "runtime_stream_gpt2_max_h200",
            "runtime_stream_gpt2_modes_h200",
            "runtime_stream_bert_h200",
        )
    ),
    *(
        Generated(
            f"benchmarks/results/{n}.md",
            _arch_sweep(n),
            f"python benchmarks/arch_sweep.py --render --out benchmarks/results/{n}",
        )
        for n in ("arch_sweep_cpu", "arch_sweep_h200")
    ),
    Generated(
        "docs/design_notes.md",
        _real_rows,
        "python benchmarks/probes/heldout_subsets.py --render learned_cost/studies/real_rows",
        block="real_rows_subsets",
    ),
    Generated(
        "docs/runtime.md",
        _over_runs("host_pace_text", HOST_PACE_RUNS),
        "python benchmarks/generated.py",
        block="host_pace_h200",
    ),
    Generated(
        "docs/runtime.md",
        _over_runs("targets_text", SERVING_TARGET_RUNS),
        "python benchmarks/generated.py",
        block="serving_targets_h200",
    ),
    *(
        Generated(f"benchmarks/results/{n}.md", _rounds(n, True), "python benchmarks/generated.py")
        for n in ROUNDS
    ),
    *(
        Generated(
            "docs/runtime.md",
            _rounds(n, False),
            "python benchmarks/generated.py",
            block=n.split("/")[0],
        )
        for n in ROUNDS
    ),
    *(
        Generated("docs/accuracy.md", _accuracy(t), "python docs/accuracy_figures.py", block=t)
        for t in ("draws_table", "wrong_kernels_table")
    ),
    *(
        Generated("docs/distributed.md", render, "python benchmarks/generated.py", block=name)
        for name, render in (
            ("comm_alpha_beta_cpu", _comm_cpu),
            ("comm_alpha_beta_cpu_runs", _comm_cpu_runs),
            ("comm_alpha_beta_cpu_low_q", _comm_cpu_low_q),
            ("comm_alpha_beta_cpu_minrank", _comm_cpu_min_rank),
            ("dp_bucket_cpu_b8", _dp_cpu),
            ("dp_bucket_cpu_runs", _dp_cpu_runs),
            ("dp_bucket_cpu_summary", _dp_cpu_summary),
            ("dp_bucket_cpu_b8_serial", _dp_cpu_serial),
            ("dp_bucket_cpu_b8_bwd", _dp_cpu_bwd),
            ("dp_bucket_cpu_earlier", _dp_cpu_earlier),
            ("pipeline_gloo_cpu", _pipeline_gloo),
        )
    ),
    *(
        Generated(
            "docs/realization.md",
            _shared_compiles(n, title=False),
            "python benchmarks/generated.py",
            block=n,
        )
        for n in SHARED_COMPILES
    ),
    Generated("data/README.md", _data_summary, "python benchmarks/generated.py", block="datasets"),
    Generated(
        "benchmarks/results/plan_additivity_h100.txt",
        _plan_additivity,
        "PYTHONPATH=. python benchmarks/plan_additivity.py data/h100_profiles.parquet "
        "--residual (below the two header lines)",
        slow=True,
    ),
    Generated(
        "data/README.md",
        _recapture,
        "python benchmarks/generated.py --slow",
        block="recapture",
        slow=True,
    ),
    Generated(
        "docs/search.md",
        _policy_record,
        "python benchmarks/generated.py",
        block="rl_policy_training",
    ),
    Generated(
        "docs/search.md",
        _tables("encoding_study"),
        "python benchmarks/generated.py",
        block="encoding_study",
    ),
    Generated(
        "docs/search.md",
        _section("search_quality", "Targets"),
        "python benchmarks/generated.py",
        block="search_quality_targets",
    ),
    Generated(
        "docs/search.md",
        _section("search_quality", "Per strategy"),
        "python benchmarks/generated.py",
        block="search_quality_per_strategy",
    ),
    # Figures quoted in prose, computed by benchmarks/doc_figures.py.
    Generated(
        "docs/architecture.md",
        _doc_figure("e2e_speedups", "transformer-block"),
        "python benchmarks/generated.py",
        block="e2e_transformer_block",
    ),
    Generated(
        "docs/design_notes.md",
        _doc_figure("cost_eval_runs"),
        "python benchmarks/generated.py",
        block="cost_eval_h100_graph",
    ),
    Generated(
        "docs/design_notes.md",
        _quoted("plan_additivity_h100.txt", PLAN_ADDITIVITY_LINES, fenced=True),
        "python benchmarks/generated.py",
        block="plan_additivity_h100",
    ),
    Generated(
        "docs/design_notes.md",
        _quoted("heldout_plans_h100.md", HELDOUT_PLANS_LINES),
        "python benchmarks/generated.py",
        block="heldout_plans_h100",
    ),
    *(
        Generated(
            "docs/design_notes.md",
            _doc_figure("timing_noise", first, second),
            "python benchmarks/generated.py",
            block=name,
        )
        for name, first, second in TIMING_NOISE
    ),
)


def _block_re(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- generated:{re.escape(name)} -->\n)(.*?)(<!-- /generated:{re.escape(name)} -->)",
        re.S,
    )


def expected(entry: Generated, current: str) -> str:
    """What `entry.path` should hold, given what it holds now (`current`)."""
    if not entry.block:
        return entry.render()
    pattern = _block_re(entry.block)
    if not pattern.search(current):
        raise ValueError(
            f"{entry.path} has no block <!-- generated:{entry.block} --> ... "
            f"<!-- /generated:{entry.block} -->; add the two markers where it belongs"
        )
    body = entry.render()
    return pattern.sub(lambda m: m.group(1) + body + m.group(3), current, count=1)


def stale(
    root: Path = ROOT, slow: bool = False, entries: tuple[Generated, ...] = GENERATED
) -> list[tuple[Generated, str]]:
    """(entry, expected text of its file) for every entry of `entries` (all by default)
    whose file is out of date; the slow entries only with `slow`."""
    texts: dict[str, str] = {}
    out = []
    for entry in entries:
        if entry.slow and not slow:
            continue
        current = texts.get(entry.path)
        if current is None:  # a generated file not written yet is stale, and written
            path = root / entry.path
            current = path.read_text() if path.exists() else ""
        want = expected(entry, current)
        if want != current:
            out.append((entry, want))
        texts[entry.path] = want  # later blocks of the same file build on this one
    return out


def stale_plots(root: Path = ROOT) -> list[Path]:
    """Plots under docs/img with saved points (learned_cost.study.plots) that were not drawn
    from them. (Whether their titles are their model's figures is checked where
    docs/learned_cost.md shows them: a plot that disagrees is left out of it.)"""
    from learned_cost.study import plots

    out = []
    for src in sorted((root / "docs" / "img").glob("*.points.json")):
        png = src.with_name(src.name.removesuffix(".points.json") + ".png")
        if not png.is_file() or plots.png_digest(png) != plots.digest(src):
            out.append(png)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only list stale files")
    p.add_argument("--slow", action="store_true", help="the slow entries too (minutes)")
    args = p.parse_args(argv)
    found: list = stale(slow=args.slow)
    for entry, want in found:
        what = f"{entry.path}" + (f" (block {entry.block})" if entry.block else "")
        if args.check:
            print(f"stale: {what}; regenerate with `{entry.command}`")
        else:
            (ROOT / entry.path).write_text(want)
            print(f"wrote {what}")
    for png in stale_plots():
        if args.check:
            print(f"stale: {png.relative_to(ROOT)}; redraw with `python benchmarks/generated.py`")
        else:
            from learned_cost.study import plots

            plots.render_png(png)
            print(f"drew {png.relative_to(ROOT)} from its points")
        found.append(png)
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
