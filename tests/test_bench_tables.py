"""The e2e and runtime-stream renderers: every alternative has a column in every cell, the
unfused plan splits a win into the executor's and the fusion's share, the re-timed ratio
and the warm-up workers' compiles are shown, and missing contenders are named."""

from __future__ import annotations

import json
import time

import pytest
import torch

from benchmarks import e2e, runtime_stream


def cell_records(warm: bool) -> list[dict]:
    base = {"model": "gpt2-block", "shape": "1,16,32,2", "dtype": "float32"}
    recs = [{"mode": "run", "warm_workers": 1 if warm else 0}]
    alts = {"eager": 400.0, "compile": 300.0, "compile-ro": 200.0, "compile-max-cg": 250.0}
    recs += [{**base, "mode": m, "median_us": v} for m, v in alts.items()]
    recs.append({**base, "mode": "compile-max", "error": "RuntimeError: no"})
    recs.append({**base, "mode": "plan-priority", "median_us": 80.0, "tuning_s": 2.0})
    recs.append({**base, "mode": "plan-unfused", "median_us": 160.0, "tuning_s": 1.0})
    recs.append({**base, "mode": "retime", "plan_us": 90.0, "alt_us": 180.0})
    if warm:
        by_mode = {"plan-priority": 30.0, "plan-unfused": 10.0, "compile": 99.0}
        recs.append({**base, "mode": "warm", "setup_s_by_mode": by_mode})
    return recs


def row_of(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [c.strip() for c in lines[1].strip("|").split("|")]
    return dict(zip(head, cells))


def test_e2e_table_splits_the_win_and_shows_the_retimed_ratio():
    row = row_of(e2e.table(cell_records(warm=True), "cpu"))
    assert [row[m] for m in e2e.BASELINES] == ["400", "—", "300", "200", "250", "err"]
    assert row["unfused, same executor"] == "160" and "plan-unfused" not in row
    assert row["tuned"] == "80 (priority)" and row["best alt"] == "200"
    assert row["ratio"] == "0.40"
    # ratio = (unfused / best alt) x (tuned / unfused)
    assert (row["unfused / best alt"], row["tuned / unfused"]) == ("0.80", "0.50")
    assert row["re-timed ratio"] == "0.50"
    # tuning: measured plans (2 + 1 s) plus the warm-up workers' plan compiles (30 + 10 s)
    assert row["tuning s"] == "43"


def test_e2e_tuning_time_is_marked_when_warm_up_compiles_were_not_recorded():
    recs = [r for r in cell_records(warm=False) if r["mode"] != "run"]
    assert row_of(e2e.table(recs, "cpu"))["tuning s"] == "3*"
    no_workers = cell_records(warm=False)
    assert row_of(e2e.table(no_workers, "cpu"))["tuning s"] == "3"


def test_e2e_renders_a_jsonl_file(tmp_path):
    path = tmp_path / "e2e_cpu.jsonl"
    recs = [{**r, "device": "cpu"} for r in cell_records(warm=True)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert e2e.render_jsonl(path) == e2e.table(recs, "cpu")
    assert e2e.render_jsonl(path).startswith("# End-to-end latency on cpu")


def test_the_warm_up_pass_records_every_plans_compile_seconds():
    """The warm record a worker returns holds the plans' compiles, not only the modes'."""
    job = ("transformer-block", (1, 8, 16, 2), ["eager"], ["greedy", "unfused"])
    line, rec = e2e._warm((*job, "float32", "cpu", "realized"))
    assert line.startswith("warmed"), line
    by_mode = rec["setup_s_by_mode"]
    assert set(by_mode) == {"eager", "plan-greedy", "plan-unfused"}
    assert all(v > 0 for v in by_mode.values())


def test_an_isolated_cell_whose_process_dies_is_recorded_as_a_crash(tmp_path):
    """A cell's process that ends with an error leaves a "crash" record; the run goes on."""
    jsonl = tmp_path / "e2e_cpu.jsonl"
    records: list = []
    emit = e2e._emitter(jsonl, "cpu", records)
    cell = ("no-such-model", (1, 8, 16, 2), ["eager"], ["unfused"], "float32", "cpu", "realized")
    e2e._isolated(cell, jsonl, "cpu", records, emit)
    assert [r["mode"] for r in records] == ["crash"]
    assert "exit code 1" in records[0]["error"]
    assert e2e.read_jsonl(jsonl) == records
    assert row_of(e2e.table(records, "cpu"))["eager"] == "crash"


def test_a_cell_is_re_timed_from_the_records_its_measurements_just_wrote(tmp_path, monkeypatch):
    """main's in-process path hands the re-timing the measurements of the same cell."""
    seen: list[dict] = []

    def fake_run_one(model, shape, modes, strategies, dtype, device, emit, *a, **k):
        base = {"model": model, "shape": ",".join(map(str, shape)), "dtype": "float32"}
        emit({**base, "mode": "eager", "median_us": 10.0})
        emit({**base, "mode": "plan-unfused", "median_us": 8.0, "groups": [[0]]})

    def fake_retime(model, shape, recs, dtype, device):
        seen.append(recs)
        return {
            "mode": "retime",
            "plan": "plan-unfused",
            "alt": "eager",
            "plan_us": 8.0,
            "alt_us": 10.0,
        }

    monkeypatch.setattr(e2e, "run_one", fake_run_one)
    monkeypatch.setattr(e2e, "retime_cell", fake_retime)
    argv = ["--models", "gpt2-block", "--shapes", "1,16,32,2", "--device", "cpu"]
    assert e2e.main([*argv, "--out-dir", str(tmp_path)]) == 0
    assert [sorted(r) for r in seen] == [["eager", "plan-unfused"]]
    assert row_of((tmp_path / "e2e_cpu.md").read_text())["re-timed ratio"] == "0.80"


def summary(steady_s: float) -> dict:
    return {"steady_s": steady_s}


def test_stream_shares_name_the_best_alternative_and_the_missing_contenders():
    sums = {
        "eager": summary(4.0),
        "compile": summary(2.0),
        "compile-ro": summary(1.0),
        "planner": summary(0.5),
        "planner-unfused": summary(0.8),
    }
    line = runtime_stream._shares(sums)
    assert "best alternative (torch.compile(reduce-overhead)): 0.50x" in line
    assert "executor's share): 0.80x" in line and "fusion's share): 0.62x" in line
    assert "not run: torch.compile(max-autotune), torch.compile(max-autotune-no-cudagraphs)" in line
    del sums["planner-unfused"]
    assert "not run:" in runtime_stream._shares(sums)
    assert "unfused plan" in runtime_stream._shares(sums).split("not run:")[1]
    assert runtime_stream._shares({"eager": summary(1.0)}) == ""


def test_stream_steady_state_leaves_out_passes_in_which_a_call_compiled():
    lengths = [128, 256, 128]

    def run(compiled_by_pass):
        passes = [
            {"total_s": 10.0 * (i + 1), "times_s": [float(i + 1)] * 3, "compiled": flags}
            for i, flags in enumerate(compiled_by_pass)
        ]
        return {"contender": "planner", "passes": passes, "checks": []}

    quiet, busy = [False] * 3, [False, True, False]
    s = runtime_stream.summarize(run([busy, quiet, busy, quiet]), lengths)
    assert s["steady_passes"] == 2 and s["steady_s"] == (20.0 + 40.0) / 2  # passes 2 and 4
    assert s["steady_median_ms"] == (2.0 + 4.0) / 2 * 1e3
    s = runtime_stream.summarize(run([busy, busy, busy]), lengths)
    assert s["steady_passes"] == 0 and s["steady_s"] == 30.0  # unsettled: the last pass


def test_stream_per_pass_table_gives_each_pass_median_call_and_total():
    passes = [{"total_s": 3.0, "times_s": [1.0, 2.0, 9.0]}, {"total_s": 0.3, "times_s": [0.1] * 3}]
    table = runtime_stream._per_pass(
        [{"contender": "eager", "passes": passes}, {"contender": "planner", "error": "x"}]
    )
    assert table.splitlines()[2] == "| eager | 2000.000 (3.00) | 100.000 (0.30) |"
    assert "backend" not in table  # a contender that failed has no row


def test_stream_says_what_static_specializations_cost_and_saved():
    from dataclasses import asdict

    from planner.runtime.backend import RuntimeStats

    st = RuntimeStats(
        static=2,
        static_build_s=6.5,
        static_gains=[0.25, -0.1],
        static_failed=["(1,): budget spent", "(9,): RuntimeError: no"],
        static_skipped=3,
    )
    text = runtime_stream._static_text(asdict(st))
    assert "2 built (6.50 s)" in text and "+25%, -10%" in text
    assert "3 skipped" in text and "1 not made, first: `(9,): RuntimeError: no`" in text


def test_every_stream_contender_has_a_title_and_every_compile_mode_a_contender():
    assert set(runtime_stream.TITLES) == set(runtime_stream.CONTENDERS)
    assert set(runtime_stream.COMPILE_MODES.values()) == {
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
    }
    assert set(e2e.COMPILE_MODES.values()) == set(runtime_stream.COMPILE_MODES.values())


def real_models_row(other: bool) -> dict:
    def timing(us: float) -> dict:
        return {"median_s": us * 1e-6, "iqr_s": us * 1e-7, "spread": 0.1, "reps": 4, "rounds": 2}

    times = {"eager": 400.0, "compile": 300.0, "reduce-overhead": 250.0, "planner": 210.0}
    if other:
        times |= {"eager@other": 350.0, "compile@other": 280.0, "reduce-overhead@other": 260.0}
        times |= {"planner@other": 220.0}
    row = {
        "cell": "gpt2:B1xS128",
        "device": "cpu",
        "dtype": "fp32",
        "bucket": True,
        "timing": {n: timing(us) for n, us in times.items()},
        "stored_measured_s": 200e-6,
        "stored_predicted_s": 180e-6,
        "errors": {"max-autotune@other": "RuntimeError: no"} if other else {},
        "command": "python benchmarks/real_models.py --bucket",
    }
    if other:
        row["other_shape"] = {"B": 1, "S": 96}
    return row


def real_models_rows(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]


def test_real_models_table_shows_the_buckets_other_shape_only_where_measured():
    from benchmarks import real_models

    old, new = real_models_row(other=False), real_models_row(other=True)
    old["cell"] = "gpt2:B4xS1024"  # another cell: a cell measured again shows its latest row
    plain = real_models.markdown([old], "")
    assert "@other" not in plain and "(other)" not in plain
    text = real_models.markdown([old, new], "")
    before, after = real_models_rows(text)
    assert (after["planner"], after["served/tuned"]) == ("210 ±10%", "1.05")
    assert after["other"] == "B1xS96" and after["planner @other"] == "220 ±10%"
    assert after["best alt @other"] == "260 ±10% (reduce-overhead)"
    assert after["served/tuned (other)"] == "1.10"
    assert "max-autotune@other: RuntimeError: no" in after["notes"]
    # a row without the other shape keeps its columns, with the new ones empty
    assert before["served/tuned"] == "1.05" and before["pred/meas"] == "0.90"
    cols = ("other", "planner @other", "best alt @other", "served/tuned (other)")
    assert [before[c] for c in cols] == ["—"] * 4
    assert "other shape: worst 1.10 over 1 cell(s)" in text
    # without the new columns the old row renders exactly as before
    assert real_models_rows(plain)[0] == {k: v for k, v in before.items() if k not in cols}


def test_real_models_table_shows_a_remeasured_cells_latest_row_only():
    from benchmarks import real_models

    first, again = real_models_row(other=False), real_models_row(other=False)
    again["timing"] = {**again["timing"], "planner": {**again["timing"]["planner"]}}
    again["timing"]["planner"]["median_s"] *= 2
    again["command"] = "python benchmarks/real_models.py --bucket --redo"
    rows = real_models_rows(real_models.markdown([first, again], ""))
    assert len(rows) == 1 and rows[0]["served/tuned"] == "2.10"
    text = real_models.markdown([first, again], "")
    assert "--redo" in text and "`python benchmarks/real_models.py --bucket`" not in text


def test_stream_static_after_option_parses_and_is_reported_only_when_recorded():
    assert runtime_stream._static_after("auto") == "auto"
    assert runtime_stream._static_after("never") is None
    assert runtime_stream._static_after("3") == 3
    for bad in ("0", "-1", "sometimes", ""):
        with pytest.raises(SystemExit, match="--static-after"):
            runtime_stream._static_after(bad)
    assert runtime_stream._static_setting({}) == ""
    assert runtime_stream._static_setting({"static_after": None}) == " (static_after=never)"
    assert runtime_stream._static_setting({"static_after": "auto"}) == " (static_after=auto)"


def test_stream_counts_collections_and_names_a_changed_collector():
    counts = runtime_stream._process_counts(cuda=False)
    assert {"gc0", "gc1", "gc2"} <= set(counts) and all(v >= 0 for v in counts.values())
    assert runtime_stream._gc_text({}) == "" and runtime_stream._gc_text({"gc": "on"}) == ""
    assert "frozen" in runtime_stream._gc_text({"gc": "freeze"})
    assert "off" in runtime_stream._gc_text({"gc": "off"})


def test_stream_served_vs_tuned_compares_like_with_like_at_each_representative():
    lengths = [100, 200, 100, 200]
    passes = [
        {"total_s": 1.0, "times_s": [1e-3, 2e-3, 1e-3, 2e-3], "compiled": [False] * 4}
        for _ in range(3)
    ]
    rep = {"128": {"b2b_s": 0.5e-3, "synced_s": 1.2e-3}, "256": {"b2b_s": 1e-3, "synced_s": 3e-3}}
    planner = {"contender": "planner", "passes": passes, "checks": [], "rep_timing": rep}
    tuned = [  # what tune stored: one bucket with its one-call latency, one from before it
        {"range": [129, 256], "pow2_bucket": "129-256", "measured_ms": 0.8, "synced_ms": 2.0},
        {"range": [65, 128], "pow2_bucket": "65-128", "measured_ms": 0.5, "synced_ms": None},
        {"range": [257, 512], "pow2_bucket": "257-512", "measured_ms": 2.0, "synced_ms": 4.0},
    ]
    meta = {"lengths": lengths, "tuned": tuned, "dim": "S"}
    rows = runtime_stream.served_vs_tuned(meta, [planner])
    assert [r["rep"] for r in rows] == [128, 256]  # ordered; 512 was not timed
    low, high = rows
    assert low["b2b_ratio"] == pytest.approx(1.0) and low["synced_ratio"] is None
    assert high["b2b_ratio"] == pytest.approx(1.25) and high["synced_ratio"] == pytest.approx(1.5)
    assert high["stream_ratio"] == pytest.approx(2.0 / 2.0)  # the bucket's steady median / 2 ms
    text = runtime_stream._rep_text(meta, [planner, {"contender": "eager", "error": "x"}])
    assert "| 129-256 | 256 | 0.800 | 2.000 | 1.000 | 3.000 | 1.25 | 1.50 | 1.00 |" in text
    assert "| 65-128 | 128 | 0.500 | n/a | 0.500 | 1.200 | 1.00 | n/a | n/a |" in text
    line = runtime_stream._vs_tuned_text(rows)
    assert "back to back (tune's stored latency) 1.00..1.25" in line
    assert "one call waited for 1.50..1.50" in line
    untimed = {k: v for k, v in planner.items() if k != "rep_timing"}  # a run before it
    assert runtime_stream.served_vs_tuned(meta, [untimed]) == []
    assert runtime_stream._rep_text(meta, [untimed]) == ""


def test_a_representative_recurs_until_the_backend_decides_its_specialization():
    from types import SimpleNamespace

    stats = SimpleNamespace(static_gains=[], static_failed=[])
    be, calls = SimpleNamespace(stats=stats), []

    def call(decide_at: int, gain: float):
        calls.append(1)
        if len(calls) == decide_at:
            stats.static_gains.append(gain)

    dev = SimpleNamespace(type="cpu")  # no device to wait for
    said = runtime_stream.recur_until_decided(lambda: call(120, 0.2), be, 5.0, dev)
    assert said.startswith("static specialization serves it, gain +20% (150 calls")
    at = len(calls) + 10
    said = runtime_stream.recur_until_decided(lambda: call(at, -0.1), be, 5.0, dev)
    assert said.startswith("kept the bucket's (static slower), gain -10% (50 calls")
    said = runtime_stream.recur_until_decided(lambda: None, be, 0.05, dev)
    assert said.startswith("not specialized within 0 s (")
    stats.static_failed.append("x")  # failed before: only a new failure counts
    said = runtime_stream.recur_until_decided(
        lambda: stats.static_failed.append("y"), be, 30.0, dev
    )
    assert said == "specialization failed (50 calls)"


def test_stream_per_bucket_line_compares_with_the_best_alternative_and_names_the_worst():
    sums = {
        "compile": {"steady_s": 2.0, "steady_bucket_median_ms": {"65-128": 1.0, "129-256": 1.0}},
        "compile-ro": {"steady_s": 1.0, "steady_bucket_median_ms": {"65-128": 0.5, "129-256": 2.0}},
        "planner": {"steady_s": 0.9, "steady_bucket_median_ms": {"65-128": 0.55, "129-256": 1.0}},
    }
    line = runtime_stream._per_bucket_text(sums)
    assert line.startswith("Per bucket, planner / torch.compile(reduce-overhead) steady")
    assert "65-128 1.10, 129-256 0.50" in line  # ordered by bucket
    assert "geometric mean 0.74, worst 1.10 (65-128)" in line
    assert runtime_stream._per_bucket_text({"planner": sums["planner"]}) == ""


def test_stream_other_sizes_are_each_tuned_buckets_shortest_and_a_middle_length():
    lengths = [130, 200, 256, 150, 130, 300, 512, 90]
    tuned = [
        {"range": [129, 256], "pow2_bucket": "129-256"},
        {"range": [257, 512], "pow2_bucket": "257-512"},  # only its representative is met
        {"range": [65, 128], "pow2_bucket": "65-128"},
    ]
    # 129-256: 130 shortest, then the middle of (150, 200); 257-512: 300; 65-128: 90
    assert runtime_stream.other_sizes(lengths, tuned) == [90, 130, 200, 300]
    assert runtime_stream.other_sizes(lengths, tuned, per_bucket=1) == [90, 130, 300]
    assert runtime_stream.other_sizes(lengths, tuned, per_bucket=0) == []


def test_stream_rotation_times_new_lengths_against_repeated_ones():
    from types import SimpleNamespace

    last: list[int] = []

    def fn(x: torch.Tensor) -> None:  # a call costs more when its length is not the last one's
        n = x.shape[0]
        time.sleep(0.004 if last and last[-1] != n else 0.001)
        last.append(n)

    inputs = {s: (torch.zeros(s),) for s in (3, 5, 7)}
    got = runtime_stream.rotation_timings(
        fn,
        inputs,
        {"1-8": [3, 5, 7], "9-16": [9]},
        SimpleNamespace(type="cpu"),
        rounds=3,
        repeats=3,
    )
    assert list(got) == ["1-8"]  # a bucket with one length cannot change
    row = got["1-8"]
    assert row["sizes"] == 3
    assert 0.001 <= row["same_s"] < 0.004 <= row["changed_s"]
    assert row["changed_host_s"] <= row["changed_s"]
    results = [{"contender": "planner", "rotation": got}, {"contender": "eager", "error": "x"}]
    text = runtime_stream._rotation_text(results)
    assert "| 1-8 | 3 |" in text and "fusion-planner backend: same ms | new ms" in text
    line = runtime_stream._rotation_line(results)
    ratio = row["changed_s"] / row["same_s"]
    assert line.endswith(f"fusion-planner backend {ratio:.2f}..{ratio:.2f}.")
    assert runtime_stream._rotation_text([{"contender": "planner"}]) == ""


def test_stream_other_sizes_compare_with_the_buckets_stored_figures_and_the_alternatives():
    tuned = [
        {"range": [129, 256], "pow2_bucket": "129-256", "measured_ms": 0.5, "synced_ms": 1.0},
        {"range": [65, 128], "pow2_bucket": "65-128", "measured_ms": 0.4, "synced_ms": None},
    ]
    meta = {"lengths": [100, 200], "tuned": tuned, "dim": "S"}
    planner = {
        "contender": "planner",
        "other_timing": {
            "200": {"b2b_s": 0.55e-3, "synced_s": 0.9e-3},
            "100": {"b2b_s": 0.4e-3, "synced_s": 0.8e-3},
        },
    }
    ro = {"contender": "compile-ro", "other_timing": {"200": {"b2b_s": 0.6e-3, "synced_s": 1.2e-3}}}
    eager = {"contender": "eager", "other_timing": {"200": {"b2b_s": 2e-3, "synced_s": 2.4e-3}}}
    rows = runtime_stream.served_other(meta, [eager, ro, planner])
    assert [r["size"] for r in rows] == [100, 200]
    low, high = rows
    assert high["b2b_ratio"] == pytest.approx(1.1) and high["synced_ratio"] == pytest.approx(0.9)
    assert high["best_alt"] == "compile-ro" and high["vs_alt"] == pytest.approx(0.75)
    assert low["synced_ratio"] is None and low["best_alt"] is None  # nothing stored, none timed
    text = runtime_stream._other_text(meta, [eager, ro, planner])
    assert (
        "| 129-256 | 200 | 0.500 | 1.000 | 2.000 | 2.400 | 0.600 | 1.200 | 0.550 | 0.900 | 1.10 | 0.90 | 0.75 (torch.compile(reduce-overhead)) |"
        in text
    )
    line = runtime_stream._other_line(rows)
    assert line.startswith("At 2 other sizes") and "one call / tuned one call 0.90..0.90" in line
    assert runtime_stream.served_other(meta, [eager]) == []
    assert runtime_stream._other_text(meta, [eager]) == ""


def test_stream_records_the_threads_and_cpus_that_worked_during_a_pass():
    before = runtime_stream.cpu_snapshot()
    if not before:
        pytest.skip("no /proc here")
    t0 = time.process_time()
    while time.process_time() - t0 < 0.1:  # the main thread works, nothing else
        pass
    got = runtime_stream.cpu_delta(before, runtime_stream.cpu_snapshot())
    assert got["working_threads"] >= 1 and got["all_threads"] >= got["working_threads"]
    assert got["threads"][0][1] > 0 and got["cpus"][0][1] > 0
    assert got["main_cpu"] is not None and got["main_cpu"] >= 0
    assert runtime_stream.cpu_delta({}, before) == {}


def test_host_pace_table_lists_each_contender_process_with_its_passes(tmp_path):
    meta = {"kind": "meta"}
    cpu = {"main_cpu": 3, "working_threads": 1, "all_threads": 9}
    passes = [
        {"host_s": [5e-3, 7e-3]},
        {"host_s": [0.4e-3, 0.5e-3, 0.6e-3], "cpu": cpu},
        {"host_s": [0.9e-3], "cpu": cpu},
    ]
    rows = [meta, {"kind": "contender", "contender": "planner", "passes": passes}]
    rows.append({"kind": "contender", "contender": "eager", "error": "timed out"})
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    text = runtime_stream.host_pace_text([path])
    (line,) = [ln for ln in text.splitlines() if "fusion-planner backend" in ln]
    assert "| 0.500 / 0.900 | 3, 3 | 1 of 9, 1 of 9 |" in line  # the cold pass left out
    assert "eager" not in text


def test_stream_rounds_compare_the_planner_with_the_best_alternative_within_each_round(tmp_path):
    lengths = [100, 200]

    def contender(name: str, ms: tuple[float, float]) -> dict:
        passes = [
            {"total_s": 9.0, "times_s": [1.0, 1.0], "host_s": [0.5, 0.5], "compiled": [True] * 2}
        ] + [
            {
                "total_s": sum(ms) / 1e3,
                "times_s": [m / 1e3 for m in ms],
                "host_s": [m / 2e3 for m in ms],
                "compiled": [False] * 2,
            }
        ] * 2
        return {"kind": "contender", "contender": name, "passes": passes, "checks": []}

    meta = {"kind": "meta", "lengths": lengths, "command": "python benchmarks/runtime_stream.py"}
    paths = []
    for k, (ro, planner) in enumerate((((1.0, 2.0), (0.5, 1.0)), ((1.0, 2.0), (2.0, 3.0))), 1):
        rows = [meta, contender("eager", (9.0, 9.0)), contender("compile-ro", ro)]
        rows.append(contender("planner", planner))
        path = tmp_path / f"rs_r{k}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows))
        paths.append(path)
    text = runtime_stream.rounds_text(paths)
    # round 1: 1.5 ms against reduce-overhead's 3 ms; round 2: 5 against 3
    assert "| 0.50 (torch.compile(reduce-overhead)) | 0.50 | 0.50 |" in text
    assert "| 1.67 (torch.compile(reduce-overhead)) | 1.73 | 2.00 |" in text
    assert "steady pass median 1.08, range 0.50..1.67" in text
    assert "| 1 (`rs_r1.jsonl`) | 0.018, 4.500 | 0.003, 0.750 | 0.002, 0.375 |" in text
    agg = tmp_path / "rs.jsonl"
    agg.write_text(json.dumps({"kind": "rounds", "rounds": [p.name for p in paths]}))
    assert runtime_stream.render_jsonl(agg) == text
    assert runtime_stream.rounds_text([]) == "No round has finished yet.\n"


def test_stream_report_names_the_accuracy_rule_its_checks_used():
    meta = {"dtype": "bf16"}
    new = [{"checks": [{"ok": True, "against": "float64 reference"}]}, {"checks": []}]
    text = runtime_stream._check_rule_text(meta, new)
    assert "higher precision" in text and "float64 reference" in text
    old = [{"checks": [{"ok": False, "why": "values differ"}]}]  # runs before the field
    assert "fixed tolerance for bf16" in runtime_stream._check_rule_text(meta, old)


def test_serving_targets_are_judged_per_run_with_the_worst_bucket(tmp_path):
    lengths = [100, 200]

    def contender(name: str, ms: tuple[float, float], rep: dict | None = None) -> dict:
        steady = {
            "total_s": sum(ms) / 1e3,
            "times_s": [m / 1e3 for m in ms],
            "host_s": [m / 2e3 for m in ms],
            "compiled": [False] * 2,
        }
        first = {
            "total_s": 9.0,
            "times_s": [1.0, 1.0],
            "host_s": [0.5, 0.5],
            "compiled": [True] * 2,
        }
        out = {"kind": "contender", "contender": name, "passes": [first, steady, steady]}
        out["checks"] = []
        if rep is not None:
            out["rep_timing"] = rep
        return out

    tuned = [
        {"pow2_bucket": "65-128", "range": [65, 128], "measured_ms": 1.0, "synced_ms": 1.2},
        {"pow2_bucket": "129-256", "range": [129, 256], "measured_ms": 2.0, "synced_ms": 2.4},
    ]
    meta = {"kind": "meta", "lengths": lengths, "tuned": tuned, "model": "m.py:factory"}
    meta["date"] = "2026-11-29 06:00:00"
    paths = []
    # run 1: the planner at half reduce-overhead's time, served as tuned; run 2: slower,
    # and its second bucket served at 1.5x what tune stored
    for k, (planner, b2b) in enumerate((((0.5, 1.0), (1.0, 2.0)), ((1.5, 3.0), (1.0, 3.0))), 1):
        rep = {
            "128": {"b2b_s": b2b[0] / 1e3, "synced_s": 1e-3, "static": ""},
            "256": {"b2b_s": b2b[1] / 1e3, "synced_s": 2e-3, "static": ""},
        }
        rows = [meta, contender("compile-ro", (1.0, 2.0)), contender("planner", planner, rep)]
        path = tmp_path / f"run{k}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows))
        paths.append(path)
    text = runtime_stream.targets_text(paths)
    assert (
        "| `run1.jsonl` | m | 2026-11-29 06:00 | 1.00 met | not run | 0.50 met | 0.50 met |" in text
    )
    assert (
        "| `run2.jsonl` | m | 2026-11-29 06:00 | 1.50 **missed** | not run | 1.50 **missed** |"
        in text
    )
    tally = text.split("Over these runs:")[1]
    assert "representatives: met in 1 of 2 runs" in tally and "other sizes" not in tally


@pytest.mark.parametrize("name", ["llama_h200.sqlite", "bert_h200.sqlite"])
def test_stream_reads_the_stored_latency_of_every_tuned_bucket(tmp_path, name):
    """A cache tuned over S=128..512 has three bucket plans, whether the model takes one
    input of that length (LLaMA) or two (BERT: input_ids and attention_mask)."""
    import shutil

    from benchmarks.generated import ROOT

    db = tmp_path / name  # opening a SQLite cache may write journal files beside it
    shutil.copy(ROOT / "benchmarks/results/caches" / name, db)
    rows = runtime_stream.tuned_latencies(f"sqlite:///{db}", "S")
    assert [r["range"] for r in rows] == [[128, 128], [129, 256], [257, 512]]
    assert [r["pow2_bucket"] for r in rows] == ["65-128", "129-256", "257-512"]
    assert all(r["measured_ms"] > 0 for r in rows)
