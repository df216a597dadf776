"""The `fusion-plan` command line behaves like the tools people know: --version, defaults
in help, global flags anywhere, one spelling of each flag, parse-time errors, quiet broken
pipes, package-relative defaults, a fast start, human units, progress on stderr."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli import fmt
from cli.common import Resolved, capture_for_planning
from cli.main import COMMANDS, build_parser, main
from planner import progress
from planner.fusion.partition import Partition
from planner.hardware import device_fingerprint
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from zoo.modelspec import resolve

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        **kw,
    )


def _parse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


# ---- start-up ---------------------------------------------------------------------------
def test_importing_the_cli_and_its_top_level_parser_loads_no_heavy_module():
    """`fusion-plan --help` stays fast because nothing heavy is imported to build it."""
    code = (
        "import sys; from cli.main import build_parser; build_parser(); "
        "heavy = ('torch', 'torch._inductor', 'optuna', 'sklearn', 'matplotlib'); "
        "print([m for m in heavy if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[]"


def test_each_command_help_and_parse_error_load_no_heavy_module():
    """`fusion-plan COMMAND --help` and a bad flag's error build only that command's
    parser, in one fresh interpreter per command: none of them imports torch, Optuna,
    scikit-learn or matplotlib, and each still prints its help or its error."""
    code = (
        "import sys\n"
        "from cli.main import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "heavy = ('torch', 'optuna', 'sklearn', 'matplotlib')\n"
        "print(code, [m for m in heavy if m in sys.modules], file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in COMMANDS:
        for argv, want_code, want_text in (
            ([name, "--help"], 0, f"usage: fusion-plan {name}"),
            ([name, "--no-such-flag"], 2, "error: "),
        ):
            out = subprocess.run(
                [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env
            )
            last = out.stderr.strip().splitlines()[-1]
            assert last == f"{want_code} []", (argv, out.stderr[-2000:])
            assert want_text in out.stdout + out.stderr, argv
    # values the command's parser refuses (choices, the option types): cheap too
    for argv, flag in (
        (["tune", "--top-k", "0"], "--top-k"),
        (["plan", "--strategy", "nope"], "--strategy"),
        (["measure", "--cost-model", "nope"], "--cost-model"),
        (["tune", "--buckets", "learned"], "--buckets"),
        (["analyze", "--device", "nope"], "--device"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env
        )
        assert out.stderr.strip().splitlines()[-1] == "2 []", (argv, out.stderr[-2000:])
        assert f"fusion-plan {argv[0]}: error: argument {flag}" in out.stderr, argv


def test_names_the_parsers_spell_out_match_the_registries():
    """The parsers name strategies, dtypes, MLP forms and defaults without importing the
    modules that define them (those import torch): the copies agree with the originals."""
    from cli.options import DTYPE_NAMES
    from cli.parsers.cost import MLP_FORMS
    from cli.parsers.train_policy import RL_ITERS, SHIPPED_POLICY
    from learned_cost.mlp import FORMS
    from search.flags import STRATEGY_NAMES
    from search.rl_policy import DEFAULT_POLICY
    from search.rl_train import TrainConfig
    from search.strategies import STRATEGIES
    from zoo.modelspec import DTYPES

    assert sorted(STRATEGY_NAMES) == sorted(STRATEGIES)
    assert sorted(DTYPE_NAMES) == sorted(DTYPES)
    assert MLP_FORMS == FORMS
    assert TrainConfig.rl_iters == RL_ITERS
    assert SHIPPED_POLICY.resolve() == DEFAULT_POLICY.resolve()


def test_version_and_top_level_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("fusion-plan ") and f"torch {torch.__version__}" in out
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


# ---- flags ------------------------------------------------------------------------------
def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 30.0)" in out  # --budget-seconds
    assert "(default: 3)" in out  # --top-k
    assert "(default: pow2)" in out  # --buckets


def test_global_flags_before_or_after_the_command(capsys):
    assert main(["-v", "zoo", "--format", "json"]) == 0
    assert logging.getLogger().level == logging.INFO
    assert main(["zoo", "--format", "json", "-vv"]) == 0
    assert logging.getLogger().level == logging.DEBUG
    assert main(["zoo", "-q"]) == 0
    assert logging.getLogger().level == logging.WARNING
    # configured once: one handler, on stderr, however often main runs
    handlers = logging.getLogger().handlers
    assert len(handlers) == 1 and handlers[0].stream is sys.stderr
    capsys.readouterr()


def _options(command: str) -> dict[str, object]:
    """option string -> its action, for `command`'s parser."""
    sub = next(a for a in build_parser(command)._actions if a.dest == "command")
    return {s: a for a in sub.choices[command]._actions for s in a.option_strings}


def test_the_same_flags_with_the_same_names_and_defaults_across_commands():
    for cmd in ("tune", "measure", "collect", "device-bench"):
        opts = _options(cmd)
        assert "--threads" in opts and opts["--threads"].default is None, cmd
    for cmd in ("analyze", "plan", "tune", "measure", "collect"):
        opts = _options(cmd)
        assert opts["--device"].default is None and opts["--device"].metavar == "NAME", cmd
        assert opts["--device"].type is _options("plan")["--device"].type, cmd
    for cmd in ("analyze", "plan", "tune", "measure"):
        assert _options(cmd)["--dtype"].default is None, cmd
        assert _options(cmd)["--format"].default == "table", cmd
    assert _options("plan")["--storage"].help == _options("tune")["--storage"].help
    assert _options("plan")["--cost-model"].type is _options("tune")["--cost-model"].type


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tune", "--buckets", "learned"], "unknown bucket policy"),
        (["tune", "--buckets", "kmeans:4"], "observed shapes are not available"),
        (["tune", "--buckets", "edges:a,b"], "bad edges"),
        (["tune", "--cost-model", "no/such/model.json"], "no cost model file"),
        (["plan", "--cost-model", "missing.json"], "no cost model file"),
        (["collect", "--out", "x.parquet", "--learned", "missing.json"], "no cost model file"),
        (["tune", "--storage", "bogus"], "not a known form"),
        (["measure", "--device", "tpu9"], "unknown device"),
        (["tune", "--dtype", "fp8"], "unknown dtype"),
        (["tune", "--threads", "0"], "must be >= 1"),
    ],
)
def test_bad_values_are_refused_at_parse_time(argv, message, capsys):
    assert message in _parse_error(argv, capsys)


def test_the_committed_cost_model_is_found_from_any_directory(tmp_path, monkeypatch):
    from search.cost_models import committed_model
    from search.flags import cost_model_arg

    monkeypatch.chdir(tmp_path)
    assert cost_model_arg("learned") == "learned" and committed_model("cpu").is_file()


def test_a_timing_command_refuses_another_machines_device(capsys):
    other = "h100" if torch.device("cpu") and not torch.cuda.is_available() else "cpu"
    code = main(["measure", "--model", "zoo:matmul", "--device", other])
    assert code == 2 and "measures on this machine" in capsys.readouterr().err


# ---- output -----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["zoo"], ["cache", "ls", "--cache", "{tmp}/plans.sqlite"]])
def test_a_closed_pipe_ends_quietly(argv, tmp_path):
    """`fusion-plan cache ls --format json | head -0`: no traceback, the SIGPIPE status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [a.format(tmp=tmp_path) for a in argv]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *argv, "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # the reader leaves before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_zoo_lists_every_model_with_its_dims(capsys):
    assert main(["zoo", "--format", "json"]) == 0
    models = {m["model"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert set(models) == {f"zoo:{n}" for n in __import__("zoo").ZOO}
    assert models["zoo:mlp"]["defaults"]["D"] > 0 and "B" in models["zoo:mlp"]["dynamic"]
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out
    assert "zoo:transformer-block" in out and "B=8,S=512,D=768,H=12" in out


def test_cost_report_writes_stdout_and_reads_the_package_models(tmp_path, monkeypatch, capsys):
    """Run from another directory: the shipped models are found, nothing is written."""
    monkeypatch.chdir(tmp_path)
    assert main(["cost", "report"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Learned cost model") and "learned_cost/models/cpu.json" in out
    assert list(tmp_path.iterdir()) == []


def _stored_mlp_plan(url: str) -> tuple[str, list[str]]:
    """A plan for zoo:mlp stored as `tune` stores it (with the model's label)."""
    spec = resolve("zoo:mlp", "B=4,D=16,HID=32,L=1")
    graph = capture_for_planning(Resolved(spec, "cpu", torch.float32)).graph
    plan = Plan.from_partition(
        Partition.singletons(graph),
        device="cpu",
        dtype="float32",
        strategy="greedy",
        cost_model="analytical/1",
        predicted_s=2e-5,
        device_fingerprint=device_fingerprint(),
    ).with_measurement(58.57989e-3, eager_s=3e-2)
    buckets = parse_dynamic("B=1..8", spec.dims)
    with PlanCache(url) as cache:
        cache.set_bucket_spec(graph.structure_key, buckets)
        cache.store(plan, buckets.bucket_of(graph.input_shapes), label=spec.label)
    return spec.label, [n.name for n in graph.nodes]


def test_cache_ls_shows_the_label_and_show_names_the_ops(tmp_path, capsys):
    url = str(tmp_path / "plans.sqlite")
    label, names = _stored_mlp_plan(url)
    assert main(["cache", "ls", "--cache", url]) == 0
    out = capsys.readouterr().out
    assert label[:25] in out and "58.6 ms" in out and "B 3..4" in out
    entry = json.loads(_json_ls(url, capsys))["entries"][0]
    assert main(["cache", "show", entry["id"][:6], "--cache", url]) == 0
    out = capsys.readouterr().out
    groups = out.split("groups (")[1].split("history")[0]
    assert all(name in groups for name in names)
    assert "node indices" not in groups
    assert main(["cache", "show", entry["id"][:6], "--cache", url, "--format", "json"]) == 0
    ops = json.loads(capsys.readouterr().out)["group_ops"]
    assert sorted(n for g in ops for n in g) == sorted(names)


def _json_ls(url: str, capsys) -> str:
    assert main(["cache", "ls", "--cache", url, "--format", "json"]) == 0
    return capsys.readouterr().out


# ---- units and timing display -----------------------------------------------------------
def test_bucket_specs_and_buckets_read_as_ranges_of_named_dims():
    spec = parse_dynamic("S=100..1024", {"B": (0, 0), "S": ((0, 1), (1, 1))}, "pow2")
    assert spec.describe() == "S 100..1024 in powers of two"
    labels = [spec.label(b) for b in spec.buckets([(8, 1024, 64), (8, 1024)])]
    assert labels == ["S 100..128", "S 129..256", "S 257..512", "S 513..1024"]
    edges = parse_dynamic("B=2..4", {"B": (0, 0)}, "edges:2,4")
    assert [edges.label(b) for b in edges.buckets([(4, 16)])] == ["B 2", "B 3..4"]


def test_times_and_bytes_in_human_units():
    assert fmt.time_s(58579.89e-6) == "58.6 ms"
    assert fmt.time_s(203988.7e-6) == "204 ms"
    assert fmt.time_s(4.2e-6) == "4.20 µs"
    assert fmt.time_s(3.5) == "3.50 s"
    assert fmt.time_s(None) == "-"
    assert fmt.bytes_(12_600_000) == "12.6 MB"
    assert fmt.bucket("[1,64-64,256]") == "64"
    assert fmt.bucket("bucket:[8,257-512,768]", [("S", 0, 1)]) == "S 257..512"


class _T:
    def __init__(self, median_s: float, iqr_s: float, stable: bool = True):
        self.median_s, self.iqr_s, self.stable = median_s, iqr_s, stable


def test_a_speedup_is_marked_when_a_rerun_may_contradict_it():
    steady = fmt.speedup(_T(2e-3, 0.02e-3), _T(1e-3, 0.01e-3))
    assert steady == "2.00x"
    assert fmt.speedup(_T(2e-3, 0.02e-3), _T(1e-3, 0.01e-3, stable=False)).endswith("?")
    assert fmt.speedup(_T(2e-3, 0.5e-3), _T(1e-3, 0.01e-3)).endswith("?")  # noisy base
    # tight timings whose quartile ranges overlap: faster or slower is not settled
    assert fmt.speedup(_T(1.02e-3, 0.08e-3), _T(1e-3, 0.08e-3)).endswith("?")
    assert fmt.timing(_T(1e-3, 0.04e-3)) == "1.00 ms ±2%"


# ---- progress ---------------------------------------------------------------------------
def test_progress_plain_lines_carry_count_and_eta():
    stream = io.StringIO()
    progress.configure("plain", interval_s=0.0, stream=stream)
    try:
        for _ in progress.track(range(4), "tune", unit="bucket"):
            progress.say("a message")
    finally:
        progress.configure()
    text = stream.getvalue()
    assert "tune: 1/4 bucket (25%)" in text and "ETA" in text
    assert "tune: 4/4 bucket (100%)" in text and text.count("a message") == 4


def test_progress_bar_on_a_terminal_keeps_messages_off_the_bar():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    progress.configure("auto", stream=stream)
    try:
        with progress.bar(3, "collect", unit="graph") as b:
            b.update()
            progress.say("job 1 done")
            b.update(2)
    finally:
        progress.configure()
    text = stream.getvalue()
    assert "collect" in text and "3/3" in text and "graph" in text
    assert "job 1 done\n" in text


def test_log_records_during_a_bar_are_written_above_it():
    from cli.main import _LogHandler

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    progress.configure("bar", stream=stream)
    log = logging.getLogger("test_cli.bar")
    handler = _LogHandler(stream)
    log.addHandler(handler)
    try:
        with progress.bar(2, "tune", unit="bucket") as b:
            b.update()
            log.warning("a warning while the bar runs")
            b.update()
    finally:
        log.removeHandler(handler)
        progress.configure()
    lines = stream.getvalue().replace("\r", "\n").split("\n")
    assert "a warning while the bar runs" in lines  # a line of its own, not inside the bar


def test_progress_off_writes_nothing():
    stream = io.StringIO()
    progress.configure("off", stream=stream)
    try:
        for _ in progress.track(range(3), "x"):
            progress.say("hidden")
    finally:
        progress.configure()
    assert stream.getvalue() == ""


def test_timing_on_a_busy_cpu_uses_one_thread_and_says_so(monkeypatch, capsys):
    """Without --threads, a command timing on the CPU of a host whose load keeps half its
    cores busy times with one intra-op thread (steadier there) and says so; --threads wins; a quiet
    host or a GPU run keeps torch's count."""
    import argparse
    import os

    import torch

    from cli.common import apply_threads

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (2.1, 3.0, 2.0))
        apply_threads(argparse.Namespace(threads=None), times_on_cpu=True)
        assert torch.get_num_threads() == 1
        assert "busy (load 2.1 on 4 cores)" in capsys.readouterr().err
        torch.set_num_threads(2)
        apply_threads(argparse.Namespace(threads=None), times_on_cpu=False)  # a GPU run
        apply_threads(argparse.Namespace(threads=2), times_on_cpu=True)
        assert torch.get_num_threads() == 2 and capsys.readouterr().err == ""
        monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 0.5, 0.5))
        apply_threads(argparse.Namespace(threads=None), times_on_cpu=True)
        assert torch.get_num_threads() == 2 and capsys.readouterr().err == ""
    finally:
        torch.set_num_threads(before)
