"""Model specs, shape specs, device specs and the analyze CLI."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from cli.main import main
from planner import hardware
from planner.errors import DeviceSpecError, ModelSpecError
from zoo import modelspec


def test_parse_shape_accepts_suffixes_and_powers():
    assert modelspec.parse_shape("B=8, S=2^10,N=4k") == {"B": 8, "S": 1024, "N": 4096}
    for bad in ("B", "B=x", "B=0", "=3"):
        with pytest.raises(ModelSpecError):
            modelspec.parse_shape(bad)


def test_zoo_spec_fills_defaults_and_rejects_unknown_params():
    spec = modelspec.resolve("zoo:transformer-block", "S=128")
    assert spec.params == {"B": 8, "S": 128, "D": 768, "H": 12}
    assert spec.dims["S"] == (0, 1)
    with pytest.raises(ModelSpecError, match="no shape parameter"):
        modelspec.resolve("zoo:transformer-block", "Q=1")
    with pytest.raises(ModelSpecError, match="no zoo model"):
        modelspec.resolve("zoo:nope")


def test_file_factory_spec(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        textwrap.dedent("""
        import torch
        def make(B=2, D=8):
            return torch.nn.Linear(D, D), (torch.randn(B, D),)
    """)
    )
    spec = modelspec.resolve(f"{f}:make", "B=3")
    assert spec.params == {"B": 3, "D": 8}
    module, inputs = spec.build(dtype=torch.float64)
    assert inputs[0].shape == (3, 8) and inputs[0].dtype == torch.float64
    assert module.weight.dtype == torch.float64
    with pytest.raises(ModelSpecError, match="does not exist"):
        modelspec.resolve(f"{tmp_path}/missing.py:make")
    with pytest.raises(ModelSpecError, match="no callable"):
        modelspec.resolve(f"{f}:other")


def test_device_specs_have_sources_and_sane_ridge_points():
    for name in hardware.known_devices():
        s = hardware.get_spec(name, measured=False)
        assert s.sources and s.sm_count > 0 and s.mem_bw_Bps > 0
        assert s.peak_matmul_flops("float32") > 0
    a100 = hardware.get_spec("a100", measured=False)
    assert a100.ridge_point("float16") == pytest.approx(312e12 / 2039e9)
    with pytest.raises(DeviceSpecError):
        hardware.get_spec("tpu-v9")


def test_measured_peaks_are_stored_and_preferred(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    peaks = hardware.MeasuredPeaks(
        matmul_flops={"bfloat16": 700e12},
        mem_bw_Bps=2.9e12,
        launch_overhead_s=7e-6,
        device_fingerprint="cuda-x",
        torch_version="2.11.0",
        measured_at="now",
    )
    hardware.save_measured("h100", peaks)
    spec = hardware.get_spec("h100")
    assert spec.peak_matmul_flops("bfloat16") == 700e12
    assert spec.peak_matmul_flops("float32") == 67e12  # not measured: datasheet
    assert spec.bandwidth_Bps == 2.9e12 and spec.launch_s == 7e-6
    assert hardware.get_spec("h100", measured=False).bandwidth_Bps == 3.35e12
    (tmp_path / "fusion-planner" / "devices" / "h100.json").write_text("{not json")
    with pytest.raises(DeviceSpecError, match="does not parse"):
        hardware.get_spec("h100")


def test_analyze_cli_json(capsys):
    rc = main(
        [
            "analyze",
            "--model",
            "zoo:mlp",
            "--shape",
            "B=4,D=16,HID=32,L=1",
            "--device",
            "a100",
            "--dtype",
            "fp16",
            "--format",
            "json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "a100" and out["dtype"] == "float16"
    assert [r["category"] for r in out["rows"]] == ["compute", "pointwise", "compute"]
    assert out["unfused_s"] > out["fused_lower_bound_s"] > 0


def test_analyze_cli_reports_errors_cleanly(capsys):
    assert main(["analyze", "--model", "zoo:nope"]) == 2
    assert "no zoo model" in capsys.readouterr().err
