"""What the benchmark measures besides wall time: the run in the middle, each pipeline's peak
memory, and the device's own matmul rate, which turns the FLOPs a sweep could not avoid into its
floor (the time it would take at that rate; the ratio of a wall time to it is the model-FLOP
utilization's inverse)."""
from __future__ import annotations

import resource
import time
from pathlib import Path

import torch


def median_run(runs: list, key=None):
    """The run in the middle (the lower of the two middle ones for an even count): a run that
    happened, so its phases belong to its wall time."""
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator counter, or on Linux the process's VmHWM (writing 5 to
    /proc/self/clear_refs resets it), so each pipeline's peak is its own."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # elsewhere the peak stays the process's lifetime peak


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak allocated; CPU: peak resident set since the last reset (VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().split("\n"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def matmul_rate(device: torch.device) -> tuple[float, str]:
    """(TFLOP/s, what was measured) of a dense matmul on the device, best of several: bf16 8192³ on
    CUDA (what a 7B sweep runs), fp32 on the CPU at 1024³ with the threads torch uses (what the CPU
    runs, the tiny models in fp32)."""
    cuda = device.type == "cuda"
    n, dtype, repeats = (8192, torch.bfloat16, 10) if cuda else (1024, torch.float32, 5)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(3):
        a @ b
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - start)
    what = (f"{str(dtype).removeprefix('torch.')} {n}^3"
            + ("" if cuda else f", {torch.get_num_threads()} threads"))
    return 2 * n**3 / best / 1e12, what


def floor_figures(flops: float, wall: float, device: torch.device) -> dict:
    """A sweep's floor at the device's measured matmul rate, and its wall time's ratio to it."""
    rate, what = matmul_rate(device)
    floor = flops / (rate * 1e12)
    return {"matmul_tflop": round(flops / 1e12, 4), "device_tflops": round(rate, 3),
            "device_rate": what, "floor_s": round(floor, 4),
            "ratio_to_floor": round(wall / floor, 2)}


def device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
