"""`fusion-plan device-bench`: measure this machine's device and store the peaks."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from cli.commands.devicebench_comm import run_comm
from cli.common import apply_threads, emit
from planner import hardware
from profiling.devicebench import run_device_bench


def run(args: argparse.Namespace) -> int:
    apply_threads(args)
    if args.comm:
        return run_comm(args)
    name = hardware.local_device_name()
    datasheet = hardware.get_spec(name, measured=False)
    peaks = run_device_bench(quick=args.quick)
    path = None if args.no_save else hardware.save_measured(name, peaks, committed=args.commit)
    rows = [
        f"device-bench on {name} ({peaks.device_fingerprint}, torch {peaks.torch_version})",
        f"{'figure':<28} {'measured':>14} {'datasheet':>14} {'ratio':>7}",
    ]
    for dt, v in peaks.matmul_flops.items():
        ds = datasheet.peak_matmul_flops(dt)
        rows.append(
            f"{'GEMM ' + dt + ' TFLOP/s':<28} {v / 1e12:14.2f} {ds / 1e12:14.2f} {v / ds:7.2f}"
        )
    rows.append(
        f"{'copy bandwidth GB/s (r+w)':<28} {peaks.mem_bw_Bps / 1e9:14.1f} "
        f"{datasheet.mem_bw_Bps / 1e9:14.1f} {peaks.mem_bw_Bps / datasheet.mem_bw_Bps:7.2f}"
    )
    rows.append(
        f"{'launch overhead us':<28} {peaks.launch_overhead_s * 1e6:14.2f} "
        f"{datasheet.launch_overhead_s * 1e6:14.2f} "
        f"{peaks.launch_overhead_s / datasheet.launch_overhead_s:7.2f}"
    )
    rows.append(f"saved to {path}" if path else "not saved (--no-save)")
    emit(
        args,
        {
            "device": name,
            "measured": asdict(peaks),
            "datasheet": datasheet.to_dict(),
            "saved_to": str(path) if path else None,
        },
        "\n".join(rows),
    )
    return 0
