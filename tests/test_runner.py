"""The one measuring path: profiling.runner on CPU with real Inductor on tiny zoo models,
its records (timings and errors), and the commands that measure through it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cli.main import build_parser, main
from learned_cost.analytical import AnalyticalModel
from planner.fusion.partition import Partition
from planner.hardware import device_fingerprint, get_spec
from planner.measurement import ERROR_KINDS, MeasureError, Measurement, PlanJob, Timing
from planner.plans.buckets import parse_dynamic
from planner.runtime.graph import capture_for_serving
from profiling.runner import DeviceRunner, RealizedExecutor, ServedExecutor
from search import cost_models
from zoo.modelspec import resolve

TIMER = {"warmup": 1, "min_reps": 3, "max_reps": 6, "max_seconds": 1.0}
STEADY = {"rounds": 4, "round_s": 0.005, "warmup": 1}


@pytest.fixture(scope="module")
def mlp():
    """zoo:mlp at a tiny shape, captured as the backend captures it."""
    torch.set_num_threads(1)
    spec = resolve("zoo:mlp", "B=4,D=16,HID=32,L=1")
    module, inputs = spec.build(seed=0)
    return spec, module, tuple(inputs), capture_for_serving(module, inputs, name=spec.label)


def _sane(m: Measurement, executor: str) -> None:
    """A timing record as every measurement must be: statistics that order, within the
    timer's bounds, and the device, versions and dtype it was made under."""
    assert m.ok and m.error is None and m.executor == executor, m.error
    t = m.timing
    assert t is not None and 0 < t.min_s <= t.median_s <= t.p99_s
    if executor == "served":  # calls back to back, in rounds (DeviceRunner's `steady`)
        assert t.iqr_s >= 0 and t.reps == STEADY["rounds"] and t.copies >= 1
    else:
        assert t.iqr_s >= 0 and TIMER["min_reps"] <= t.reps <= TIMER["max_reps"]
    assert m.median_s == t.median_s and m.p99_s == t.p99_s
    assert m.device == t.device == "cpu"
    assert m.device_fingerprint == t.device_fingerprint == device_fingerprint("cpu")
    assert m.torch_version == torch.__version__.split("+")[0]
    assert m.dtype == "float32" and "matches eager" in m.check


def test_realized_plan_is_timed_with_inductor(mlp):
    _spec, _module, _inputs, captured = mlp
    runner = DeviceRunner(executor=RealizedExecutor(), device="cpu", timer=TIMER)
    m = runner.measure_plan(PlanJob(captured, Partition.whole(captured.graph)))
    _sane(m, "realized")
    assert "inductor" in m.realizations and m.compile_s > 0
    assert json.dumps(m.to_dict())  # a record serializes as it is


def test_served_plan_goes_through_the_backend_for_its_bucket(mlp):
    spec, module, inputs, captured = mlp
    buckets = parse_dynamic("B=2..8", spec.dims, "pow2")
    bucket = buckets.bucket_of(captured.graph.input_shapes)
    job = PlanJob(
        captured,
        Partition.whole(captured.graph),
        module=module,
        inputs=inputs,
        bucket=bucket,
        bucket_spec=buckets,
    )
    m = DeviceRunner(
        executor=ServedExecutor(), device="cpu", timer=TIMER, steady=STEADY
    ).measure_plan(job)
    _sane(m, "served")
    assert m.realizations == ("inductor",) and not m.fallbacks
    # the same served call alone and waited for is measured as its own figure (how it
    # compares with the back-to-back rounds depends on the machine's load and caches)
    assert math.isfinite(m.synced_s) and m.synced_s > 0


def test_failures_become_error_records_not_exceptions(mlp):
    _spec, module, inputs, captured = mlp
    runner = DeviceRunner(executor=RealizedExecutor(), device="cpu", timer=TIMER)
    other = capture_for_serving(*resolve("zoo:mlp", "B=4,D=16,HID=32,L=2").build(seed=0))
    wrong_model = runner.measure_plan(PlanJob(captured, Partition.whole(other.graph)))
    served = DeviceRunner(executor=ServedExecutor(), device="cpu", timer=TIMER, steady=STEADY)
    no_module = served.measure_plan(PlanJob(captured, Partition.whole(captured.graph)))

    def boom(*args):
        raise RuntimeError("kernel exploded")

    raised = runner.measure_callable(boom, inputs, label="boom")
    wrong = runner.measure_callable(
        lambda x: module(x) + 1.0, inputs, label="off", reference=module
    )
    for m, kind, words in [
        (wrong_model, "realize", "another model"),
        (no_module, "serve", "PlanJob.module"),
        (raised, "run", "kernel exploded"),
        (wrong, "accuracy", "DISAGREES"),
    ]:
        assert not m.ok and m.timing is None and math.isnan(m.median_s)
        assert m.error.kind == kind in ERROR_KINDS and words in m.error.message, m.error
        assert m.device_fingerprint == device_fingerprint("cpu") and m.torch_version
    with pytest.raises(ValueError):
        Measurement("x", "callable", "cpu", "fp", "2", "float32")  # neither timing nor error


def _failing_elsewhere_at(step: int, error: MeasureError) -> tuple[DeviceRunner, list]:
    """A runner whose `agree` (the ranks' agreement, here faked) reports `error` from
    another rank at its `step`-th call, and the outcomes it was asked to agree on."""
    asked: list[MeasureError | None] = []

    def agree(mine: MeasureError | None) -> MeasureError | None:
        asked.append(mine)
        return error if mine is None and len(asked) == step else mine

    return DeviceRunner(executor=RealizedExecutor(), device="cpu", timer=TIMER, agree=agree), asked


def test_a_step_another_rank_failed_fails_here_and_nothing_after_it_runs(mlp):
    # on the ranks of a program with collectives a rank must not go on alone: the runner
    # asks after realizing, after each check trial and after checking
    _spec, _module, _inputs, captured = mlp
    job = PlanJob(captured, Partition.singletons(captured.graph))
    runner, asked = _failing_elsewhere_at(1, MeasureError("realize", "on rank 1: OOM"))
    m = runner.measure_plan(job)
    assert m.error == MeasureError("realize", "on rank 1: OOM") and m.timing is None
    assert asked == [None]  # realized here, then neither checked nor timed
    why = MeasureError("accuracy", "on rank 1: output 0: off by 1")
    runner, asked = _failing_elsewhere_at(3, why)  # the second check trial
    m = runner.measure_plan(job)
    assert m.error.kind == "accuracy" and m.timing is None
    assert "output 0: on rank 1: off by 1" in m.error.message, m.error
    # realized, two trials (the third not run), then the check's outcome, agreed as failed
    assert asked[:3] == [None, None, None] and len(asked) == 4 and asked[3] == m.error


def _spy(monkeypatch) -> list[Measurement]:
    """Every plan measurement made through DeviceRunner.measure_plan, recorded."""
    seen: list[Measurement] = []
    original = DeviceRunner.measure_plan

    def spying(self, job):
        m = original(self, job)
        seen.append(m)
        return m

    monkeypatch.setattr(DeviceRunner, "measure_plan", spying)
    return seen


def test_measure_and_tune_commands_measure_through_the_runner(monkeypatch, tmp_path, capsys):
    seen = _spy(monkeypatch)
    model = ["--model", "zoo:mlp"]
    measure = ["measure", *model, "--shape", "B=4,D=16,HID=32,L=1", "--strategy", "greedy"]
    assert main([*measure, "--no-compile", "--threads", "1", "--format", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(seen) == 1 and seen[0].executor == payload["executor"] == "served"
    assert payload["results"]["plan (greedy)"]["median_s"] == seen[0].median_s
    tune = ["tune", *model, "--shape", "D=16,HID=32,L=1", "--dynamic", "B=2..2"]
    tune += ["--strategy", "greedy", "--top-k", "1", "--no-compile-baseline", "--format", "json"]
    tune += ["--keep-fused"]  # the measured plan, whether or not eager beat it here
    assert main([*tune, "--cache", str(tmp_path / "plans.sqlite")]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(seen) == 2 and seen[-1].executor == "served" and seen[-1].ok
    (bucket,) = payload["buckets"]
    assert bucket["best_s"] == seen[-1].median_s == bucket["plan"]["measured_s"]


def test_one_default_cost_model_for_every_command():
    default = cost_models.cost_model_for(None, "cpu")
    assert default.name == cost_models.cost_model_for(cost_models.DEFAULT, "cpu").name
    for command in ("plan", "tune", "measure"):
        args = build_parser(command).parse_args([command])
        assert args.cost_model is None  # each resolves None to cost_models.DEFAULT
    with pytest.raises(Exception, match="expected one of"):
        cost_models.cost_model_for("realised", "cpu")


class ScriptedRunner:
    """A Runner that runs nothing: the first plan fails to run, the others take 1 ms more
    each; callables take 5 ms. What tune does with the records is then checkable."""

    def __init__(self):
        self.jobs: list[PlanJob] = []

    def _record(self, label: str, seconds: float | None) -> Measurement:
        ctx = dict(device="cpu", device_fingerprint=device_fingerprint("cpu"))
        ctx |= dict(torch_version=torch.__version__.split("+")[0], dtype="float32")
        if seconds is None:
            return Measurement(label, "scripted", **ctx, error=MeasureError("run", "boom"))
        t = Timing(seconds, seconds, seconds, seconds, 0.0, 3, True, **ctx)
        return Measurement(label, "scripted", **ctx, timing=t)

    def measure_plan(self, job: PlanJob) -> Measurement:
        self.jobs.append(job)
        return self._record(job.label, None if len(self.jobs) == 1 else len(self.jobs) * 1e-3)

    def measure_callable(self, fn, inputs, *, label, reference=None, compile_s=0.0, **kw):
        return self._record(label, 5e-3)

    def measure_interleaved(self, fns, **kw):
        return {n: self._record(n, 5e-3) for n in fns}


def test_tune_keeps_the_fastest_record_and_drops_failed_ones(tmp_path):
    from planner.plans.cache import PlanCache
    from search.tune import TuneConfig, tune

    spec = resolve("zoo:transformer-block", "B=1,D=32,H=2")
    cfg = TuneConfig(
        spec=spec,
        dynamic="S=8..8",
        strategy="priority",
        top_k=3,
        compile_baseline=False,
        budget_seconds=5.0,
    )
    runner = ScriptedRunner()
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        (result,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, runner=runner)
    assert len(runner.jobs) == len(result.candidates) >= 2
    assert all(j.module is not None and j.bucket == result.bucket for j in runner.jobs)
    failed, *ok = result.candidates
    assert failed.measured is None and failed.error == "run: boom"
    assert result.plan.measured_s == min(c.measured.median_s for c in ok) == 2e-3
    assert result.plan.eager_s == 5e-3 and result.plan.strategy == ok[0].strategy


class SlowPlansRunner(ScriptedRunner):
    """Every plan takes 9 ms against eager's 5 ms."""

    def measure_plan(self, job: PlanJob) -> Measurement:
        self.jobs.append(job)
        return self._record(job.label, 9e-3)


def test_when_eager_beats_every_plan_tune_stores_the_unfused_plan_and_it_serves_eagerly(
    tmp_path,
):
    from planner.plans.cache import PlanCache
    from planner.runtime.backend import fusion_planner_backend
    from search.tune import TuneConfig, tune

    spec = resolve("zoo:transformer-block", "B=1,D=32,H=2")
    cfg = TuneConfig(
        spec=spec, dynamic="S=8..8", strategy="priority", top_k=2, compile_baseline=False
    )
    db = str(tmp_path / "plans.sqlite")
    with PlanCache(db) as cache:
        (result,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, runner=SlowPlansRunner())
    plan = result.plan
    assert plan.strategy == "eager" and plan.measured_s == plan.eager_s == 5e-3
    assert all(len(g.nodes) == 1 for g in plan.groups)
    assert result.best.strategy == "eager" and "stored=True" in result.stored
    module, inputs = spec.with_params(S=8).build()
    backend = fusion_planner_backend(db, device="cpu")
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), module(*inputs))
    torch._dynamo.reset()
    s = backend.stats
    assert s.exact + s.bucket == 1 and s.realized == 0, s  # the cached plan: dynamo's graph


def test_the_table_says_what_the_candidates_measured_when_eager_beat_them(tmp_path, capsys):
    from cli.commands.tune import _table
    from planner.plans.cache import PlanCache
    from search.tune import TuneConfig, tune

    spec = resolve("zoo:transformer-block", "B=1,D=32,H=2")
    cfg = TuneConfig(
        spec=spec, dynamic="S=8..8", strategy="priority", top_k=2, compile_baseline=False
    )
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        results = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, runner=SlowPlansRunner())
    text = _table("m", "cpu", "sqlite://", results, {})
    assert "eager beat every candidate (priority 9.00 ms" in text, text
