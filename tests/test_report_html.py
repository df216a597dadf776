"""The tuning report as a person sees it: `fusion-plan tune --report` on a tiny zoo model
(CPU, analytical cost), opened in headless Chromium, a screenshot taken, and the parts a
reader needs checked where the browser put them: above the fold, inside the page, not on
top of each other, one outlined group per plan group, labelled as the plan says."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import pytest

from cli import report_graph
from cli.main import main
from cli.report_charts import BucketTimes, Spread, timing_chart

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# A quiet, offline, throw-away browser: no sandbox (CI runs as root), no GPU, no network
# chatter. Playwright gives every launch a fresh temporary profile (--user-data-dir).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often give /dev/shm only 64 MB
]
VIEWPORT = {"width": 1280, "height": 900}
SVG = "{http://www.w3.org/2000/svg}"


def _tune_argv(tmp: Path, report: Path) -> list[str]:
    return [
        "tune",
        "--model",
        "zoo:transformer-block",
        "--shape",
        "B=1,D=32,H=2",
        "--dynamic",
        "S=8..16",
        "--strategy",
        "priority",
        "--top-k",
        "1",
        "--no-compile-baseline",
        "--cost-model",
        "analytical",
        "--cache",
        str(tmp / "plans.sqlite"),
        "--format",
        "json",
        "--report",
        str(report),
    ]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(report path, the job's JSON output) of one small tuning job with a report."""
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed (Debian: apt-get install graphviz)")
    tmp = tmp_path_factory.mktemp("report")
    report = tmp / "report.html"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(_tune_argv(tmp, report)) == 0
    return report, json.loads(out.getvalue())


def test_report_of_a_cache_draws_the_plans_it_holds_in_bucket_order(tuned, tmp_path, capsys):
    _, job = tuned
    cache = job["cache"]
    out = tmp_path / "cached.html"
    assert main(["report", "--cache", cache, "--out", str(out)]) == 0
    page = out.read_text()
    sections = page.split("<section class='bucket'")[1:]
    assert len(sections) == len(job["buckets"])
    # in the order of the shapes (S=8 before S=16), each with its plan's groups outlined
    labels = [re.search(r"<h2>Bucket (.*?) <small>", sec).group(1) for sec in sections]
    assert labels == [f"S={b['params']['S']}" for b in job["buckets"]]
    for sec, b in zip(sections, job["buckets"]):
        assert sec.count('class="cluster plan&#45;group"') == len(b["plan"]["groups"])
    capsys.readouterr()
    assert main(["report", "--cache", cache, "--model", "zoo:nothing", "--out", str(out)]) == 2
    assert "no cached plans for 'zoo:nothing'" in capsys.readouterr().err


def test_report_is_self_contained_and_well_formed(tuned):
    report, job = tuned
    page = report.read_text()
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page), "nothing is fetched"
    assert "<script" not in page
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    for svg in svgs:
        ElementTree.fromstring(svg)  # each drawing parses as XML on its own
    plans = [b["plan"] for b in job["buckets"]]
    # one timing chart, one roofline, per bucket a time-share bar and a drawing
    assert len(svgs) == 2 + 2 * len(plans)
    ids = re.findall(r' id="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "element ids are unique across the drawings"


def test_missing_graphviz_is_said_before_any_tuning(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(report_graph.shutil, "which", lambda name: None)
    argv = _tune_argv(tmp_path, tmp_path / "r.html")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Graphviz" in err and "apt-get install graphviz" in err
    assert not (tmp_path / "plans.sqlite").exists() and not (tmp_path / "r.html").exists()


def test_an_unwritable_report_path_is_said_before_any_tuning(tmp_path, capsys):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed (Debian: apt-get install graphviz)")
    argv = _tune_argv(tmp_path, tmp_path)  # a folder, not a file
    assert main(argv) == 2
    assert "cannot write the report" in capsys.readouterr().err
    assert not (tmp_path / "plans.sqlite").exists()


def test_timing_chart_shows_every_mode_its_spread_and_unsettled_figures():
    rows = [
        BucketTimes(
            "S=8",
            {
                "plan": Spread(1e-4, 0.9e-4, 1.2e-4, 20, True),
                "eager": Spread(2e-4, 1.9e-4, 9e-4, 20, False),  # p99 far past the scale
                "torch.compile": Spread(1.5e-4),
            },
        ),
        BucketTimes(
            "S=16",
            {"plan": Spread(3e-4), "eager": Spread(6e-4), "max-autotune": Spread(4e-4)},
        ),
    ]
    svg = ElementTree.fromstring(timing_chart(rows))
    bars = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "bar"]
    modes = Counter(g.get("data-mode") for g in bars)
    assert modes == {"plan": 2, "eager": 2, "torch.compile": 1, "max-autotune": 1}
    texts = ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]
    assert any("2.00× faster than eager" in t for t in texts)  # S=8 plan: 200 us over 100 us
    assert any("unstable" in t for t in texts) and " ".join(texts).count("not timed") == 2
    whiskers = [p for p in svg.iter(f"{SVG}path") if p.get("class") == "whisker"]
    assert len(whiskers) == 2  # only figures with a range get one
    assert any(" L" in w.get("d") for w in whiskers)  # the clipped one ends in an arrow


def _boxes_overlap(a: dict, b: dict, slack: float = 1.0) -> bool:
    return (
        a["x"] + a["width"] - slack > b["x"]
        and b["x"] + b["width"] - slack > a["x"]
        and a["y"] + a["height"] - slack > b["y"]
        and b["y"] + b["height"] - slack > a["y"]
    )


@contextlib.contextmanager
def _page_in_chromium(path: Path):
    """`path` loaded in a quiet headless Chromium: (the page, every URL it fetched)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[dev]' (it drives the Chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            fetched: list[str] = []
            page.on("request", lambda r: fetched.append(r.url))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            yield page, fetched
        finally:
            browser.close()


def test_report_in_headless_chromium(tuned, tmp_path):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    report, job = tuned
    plans = [b["plan"] for b in job["buckets"]]
    shot = tmp_path / "report.png"
    with _page_in_chromium(report) as (page, fetched):
        page.screenshot(path=str(shot))
        page.screenshot(path=str(tmp_path / "report-full.png"), full_page=True)

        assert fetched == [report.as_uri()], "the page loads nothing else"
        assert "zoo:transformer-block" in page.title()
        # The page fits the window's width: nothing to scroll sideways for.
        assert page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]

        # Above the fold: the title and the plan-vs-eager chart, one bar per bucket.
        chart = page.locator("svg.timing-chart")
        box = chart.bounding_box()
        assert box and box["y"] < VIEWPORT["height"] and box["height"] > 50
        for mode in ("plan", "eager"):
            assert chart.locator(f"g.bar[data-mode='{mode}']").count() == len(plans)
        texts = [t.bounding_box() for t in chart.locator("text").all()]
        for i, a in enumerate(texts):
            for b in texts[i + 1 :]:
                assert not _boxes_overlap(a, b), "chart labels overlap"

        # The roofline: roofs, a dot per group with work, a diamond per plan, all inside.
        roof = page.locator("svg.roofline-chart")
        assert roof.locator("path.roof").count() >= 1
        assert roof.locator("path.plan-point").count() == len(plans)
        assert roof.locator("circle.group-point").count() >= len(plans)
        frame = roof.locator("rect").first.bounding_box()
        for p in roof.locator(".point").all():
            pb = p.bounding_box()
            cx, cy = pb["x"] + pb["width"] / 2, pb["y"] + pb["height"] / 2
            assert frame["x"] <= cx <= frame["x"] + frame["width"]
            assert frame["y"] <= cy <= frame["y"] + frame["height"]

        # Per bucket: the plan drawn with one outlined, labelled cluster per group.
        sections = page.locator("section.bucket")
        assert sections.count() == len(plans)
        for k, plan in enumerate(plans):
            sec = sections.nth(k)
            clusters = sec.locator("g.cluster")
            assert clusters.count() == len(plan["groups"])
            titles = [(c.locator("text").all_text_contents() or [""])[0] for c in clusters.all()]
            # a group with no work (a view) costs "0"
            pattern = re.compile(
                r"^G(\d+) · (\w+)(?: \(fell back\))? · (?:[\d.]+ (ns|µs|ms|s)|0\b)"
            )
            found = [pattern.match(t or "") for t in titles]
            assert all(found), titles
            assert sorted(int(m.group(1)) for m in found) == list(range(len(plan["groups"])))
            assert Counter(m.group(2) for m in found) == Counter(
                g["realization"] for g in plan["groups"]
            )
            n_ops = sum(len(g["nodes"]) for g in plan["groups"])
            assert sec.locator("g.node.op").count() == n_ops
            assert sec.locator("g.node.graph-input").count() >= 1
            assert sec.locator("g.node.graph-output").count() >= 1
            assert sec.locator("tr.group-row").count() == len(plan["groups"])
            # Each group's outline is drawn and has room: its label inside its box.
            for c in clusters.all():
                outline = c.locator("path, polygon").first.bounding_box()
                label = c.locator("text").first.bounding_box()
                assert outline["width"] > 20 and outline["height"] > 20
                assert outline["x"] <= label["x"] + 1
                assert label["x"] + label["width"] <= outline["x"] + outline["width"] + 1
        # The first plan's drawing is on screen beside its table, not squeezed away.
        graph = page.locator("section.bucket .plan-graph svg").first.bounding_box()
        table = page.locator("section.bucket table.groups").first.bounding_box()
        assert graph["width"] > 200 and graph["x"] + graph["width"] <= VIEWPORT["width"]
        assert table["width"] > 300 and table["x"] >= graph["x"] + graph["width"]
    assert shot.stat().st_size > 20_000  # a page with pictures, not a blank one


def test_real_model_suite_page_in_headless_chromium(tmp_path):
    """The committed real-model page: one bar per timed contender of every cell (and of its
    other shape), each cell labelled with the planner's ratio, and nothing fetched."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    from benchmarks import real_models
    from benchmarks.generated import ROOT

    src = ROOT / "benchmarks" / "results" / "real_models_bucket_h100.jsonl"
    rows = real_models.read_jsonl(src)
    latest = {(r["cell"], r.get("dtype"), r.get("tiny")): r for r in rows}
    timed = [
        n for r in latest.values() for n, t in r.get("timing", {}).items()
        if t.get("median_s") and n.removesuffix(real_models.OTHER) in real_models.MODES
    ]  # fmt: skip
    page_file = tmp_path / "suite.html"
    page_file.write_text(real_models.html_view(rows, ""))
    with _page_in_chromium(page_file) as (page, fetched):
        assert page.locator("g.bar").count() == len(timed)
        labels = page.locator("text.bucket-label").all_text_contents()
        cells = {r["cell"] for r in latest.values()}
        assert {lab.split(" ")[0] for lab in labels} >= cells
        assert all(lab.endswith("x)") for lab in labels)
        box = page.locator("svg.timing-chart").bounding_box()
        assert box is not None and box["width"] <= VIEWPORT["width"]
    assert fetched == [page_file.as_uri()]
