"""The measured backward (profiling.backward) and `analyze --dp --backward`."""

from __future__ import annotations

import itertools
import json
import textwrap

import pytest
import torch

from cli.main import main
from planner.errors import ModelSpecError
from profiling.backward import measure_backward, steps_from_ready
from search.bucket_search import search_bucket_size


def _layers(*widths: int) -> torch.nn.Sequential:
    mods: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def test_every_parameter_is_ready_once_and_the_bytes_are_the_models() -> None:
    torch.manual_seed(0)
    model = _layers(8, 16, 32, 4)
    r = measure_backward(model, (torch.randn(3, 8),), reps=2, warmup=1)
    names = [s.name for s in r.steps]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert len(names) == len(set(names))
    grads = [b for s in r.steps for b in s.grad_bytes]
    assert sum(grads) == sum(p.numel() * p.element_size() for p in model.parameters())
    assert all(s.duration_s >= 0 for s in r.steps) and r.forward_s > 0
    assert r.unused == () and all(p.grad is None for p in model.parameters())


def test_a_sequential_model_is_ready_last_layer_first() -> None:
    torch.manual_seed(0)
    model = _layers(8, 16, 16, 16, 4)  # Linear layers at 0, 2, 4, 6
    r = measure_backward(model, (torch.randn(3, 8),), reps=3, warmup=1)
    layer = [int(s.name.split(".")[0]) for s in r.steps]
    assert layer == sorted(layer, reverse=True)
    assert layer[0] == 6 and layer[-1] == 0


def test_a_parameter_without_a_gradient_is_ready_at_the_end() -> None:
    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    r = measure_backward(TwoHeads(), (torch.randn(2, 4),), reps=1, warmup=0)
    assert set(r.unused) == {"unused.weight", "unused.bias"}
    assert {s.name for s in r.steps[-2:]} == set(r.unused)
    assert all(s.duration_s == 0 for s in r.steps[-2:])


def test_steps_follow_the_median_ready_order() -> None:
    # three passes; b is ready first in two of them, so by its median
    ready = [[0.3, 0.1, None], [0.2, 0.4, None], [0.5, 0.15, None]]
    steps, unused = steps_from_ready(["a", "b", "c"], [10, 20, 30], ready)
    assert [s.name for s in steps] == ["b", "a", "c"] and unused == ["c"]
    assert [s.duration_s for s in steps] == pytest.approx([0.15, 0.3 - 0.15, 0.0])
    assert [s.grad_bytes for s in steps] == [(20,), (10,), (30,)]


def test_the_search_on_measured_steps_picks_the_argmin_of_its_table() -> None:
    torch.manual_seed(0)
    r = measure_backward(_layers(64, 128, 128, 8), (torch.randn(4, 64),), reps=2, warmup=1)
    for alpha_s in (1e-6, 1e-2):  # bandwidth- and latency-bound links

        def ar(nbytes: int, alpha_s: float = alpha_s) -> float:
            return alpha_s + nbytes / 1e8

        choice = search_bucket_size(list(r.steps), ar, forward_s=r.forward_s)
        best = min(t for _, t in choice.table)
        assert choice.predicted_s == best == choice.predicted_for(choice.bucket_bytes)


def test_a_model_without_trainable_parameters_is_refused() -> None:
    model = torch.nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(ModelSpecError, match="no parameters that require grad"):
        measure_backward(model, (torch.randn(2, 4),))


def test_a_model_without_a_floating_output_is_refused() -> None:
    class Argmax(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).argmax(-1)

    with pytest.raises(ModelSpecError, match="no floating tensor"):
        measure_backward(Argmax(), (torch.randn(2, 4),))


def test_the_models_own_loss_is_used_where_its_output_has_one() -> None:
    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            # the logits reach `b`, the loss only `a`: `b` gets no gradient from the loss
            return {"loss": self.a(x).sum(), "logits": self.b(x)}

    r = measure_backward(WithLoss(), (torch.randn(2, 4),), reps=1, warmup=0)
    assert set(r.unused) == {"b.weight", "b.bias"}


MLP = ["analyze", "--model", "zoo:mlp", "--shape", "B=4,D=32,HID=64,L=1", "--dp", "2"]


def test_analyze_prices_the_buckets_on_the_measured_backward(capsys) -> None:
    argv = [*MLP, "--dtype", "fp32", "--device", "cpu", "--interconnect", "ib-hdr"]
    assert main([*argv, "--backward", "measured", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)["distributed"]
    bwd, gb = out["gradient_buckets"]["backward"], out["gradient_buckets"]
    assert bwd["source"] == out["train_step"]["backward"] == "measured"
    assert sum(s["grad_bytes"] for s in bwd["steps"]) == 4 * (32 * 64 + 64 + 64 * 32 + 32)
    assert gb["searched_predicted_s"] == min(r["predicted_s"] for r in gb["table"])
    assert out["train_step"]["critical_path_s"] == pytest.approx(gb["searched_predicted_s"])
    # auto on this machine's device measures too; the text names the backward
    assert main(argv) == 0
    assert "backward measured on cpu (auto" in capsys.readouterr().out
    assert main([*argv, "--backward", "estimated"]) == 0
    assert "backward estimated as 2x forward per op" in capsys.readouterr().out


def test_analyze_estimates_the_backward_of_a_what_if_device(capsys) -> None:
    argv = [*MLP, "--device", "h100", "--interconnect", "ib-hdr"]
    assert main([*argv, "--format", "json"]) == 0
    bwd = json.loads(capsys.readouterr().out)["distributed"]["gradient_buckets"]["backward"]
    assert bwd["source"] == "estimated" and "not this machine's device" in bwd["reason"]
    assert main([*argv, "--backward", "measured"]) != 0
    assert "--backward measured runs the model here" in capsys.readouterr().err


def test_a_model_with_collectives_is_estimated_and_not_measured(capsys) -> None:
    argv = ["analyze", "--model", "zoo:tp-mlp", "--shape", "B=2,S=8,D=32,HID=64", "--tp", "2"]
    argv += ["--dp", "2", "--device", "cpu", "--dtype", "fp32"]
    assert main([*argv, "--format", "json"]) == 0
    bwd = json.loads(capsys.readouterr().out)["distributed"]["gradient_buckets"]["backward"]
    assert bwd["source"] == "estimated" and "collectives" in bwd["reason"]
    assert main([*argv, "--backward", "measured"]) != 0
    assert "process group" in capsys.readouterr().err


def test_analyze_refuses_to_measure_a_model_without_trainable_parameters(capsys, tmp_path) -> None:
    f = tmp_path / "frozen.py"
    f.write_text(
        textwrap.dedent("""
        import torch
        def make(B=2, D=8):
            return torch.nn.Linear(D, D).requires_grad_(False), (torch.randn(B, D),)
        """)
    )
    argv = ["analyze", "--model", f"{f}:make", "--dp", "2", "--device", "cpu"]
    assert main([*argv, "--backward", "measured"]) != 0
    err = capsys.readouterr().err
    assert "no parameters that require grad" in err and "Traceback" not in err
    # auto: the failed measurement leaves the estimate, and the report says why
    assert main([*argv, "--format", "json"]) == 0
    bwd = json.loads(capsys.readouterr().out)["distributed"]["gradient_buckets"]["backward"]
    assert bwd["source"] == "estimated" and "measuring the backward failed" in bwd["reason"]


@pytest.mark.gpu
def test_a_cuda_backward_is_timed_with_events(capsys) -> None:
    torch.manual_seed(0)
    model = _layers(64, 256, 256, 8).cuda()
    r = measure_backward(model, (torch.randn(16, 64, device="cuda"),), reps=3, warmup=2)
    assert r.device.startswith("cuda") and r.forward_s > 0
    layer = [int(s.name.split(".")[0]) for s in r.steps]
    assert layer == sorted(layer, reverse=True)
    assert sum(b for s in r.steps for b in s.grad_bytes) == sum(
        p.numel() * 4 for p in model.parameters()
    )
    assert all(s.duration_s >= 0 for s in r.steps) and r.backward_s > 0
    # analyze on this machine's GPU measures by default
    assert main([*MLP, "--interconnect", "ib-hdr", "--format", "json"]) == 0
    bwd = json.loads(capsys.readouterr().out)["distributed"]["gradient_buckets"]["backward"]
    assert bwd["source"] == "measured" and bwd["device"].startswith("cuda")
