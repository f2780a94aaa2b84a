"""What the kernel benchmark's cases share (bench/kernels.py): the timer, a CUDA graph's replay
time, the device's own rates, checks kept rather than raised, and the table's rows."""
import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Row:
    kernel: str
    shape: str
    ours_us: float
    baseline: str
    baseline_us: float
    figure: str
    target: str
    met: bool | None
    checked: bool


class Checks:
    """Correctness at the timed shapes; failures are kept, not raised, so the table still prints."""

    def __init__(self):
        self.failures: list[str] = []

    def equal(self, name: str, actual: torch.Tensor, expected: torch.Tensor) -> bool:
        if torch.equal(actual, expected):
            return True
        differ = int((actual != expected).sum())
        self.failures.append(f"{name}: {differ} of {actual.numel()} elements differ")
        return False

    def close(self, name: str, actual: torch.Tensor, expected: torch.Tensor, atol: float,
              rtol: float) -> bool:
        excess = ((actual.double() - expected.double()).abs()
                  - (atol + rtol * expected.double().abs()))
        if not bool(torch.isnan(actual).any()) and float(excess.max()) <= 0:
            return True
        self.failures.append(f"{name}: off by up to {float(excess.max()):.3g} "
                             f"beyond atol={atol}, rtol={rtol}")
        return False


def make_timer(device: torch.device):
    """Microseconds per call: do_bench's median on CUDA, a wall-clock median elsewhere (--tiny)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3

    def wall(fn):
        fn()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e6

    return wall


def graphed_us(fn, device) -> float | None:
    """Microseconds per call replayed from a CUDA graph: the GPU time without Python's launch cost,
    which dominates kernels this short (the engine can capture them the same way). None off CUDA
    or when the call cannot be captured."""
    if device.type != "cuda":
        return None
    from triton.testing import do_bench_cudagraph

    try:
        return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    except RuntimeError:
        return None


def device_rates(device, timer, tiny: bool) -> tuple[float, float]:
    """(copy bandwidth in GB/s counting read + write, bf16 matmul TFLOP/s) of this device."""
    n_bytes = 2**20 if tiny else 2**30
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * n_bytes / timer(lambda: dst.copy_(src)) / 1e3
    n = 128 if tiny else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    tflops = 2 * n**3 / timer(lambda: a @ b) / 1e6
    return bandwidth, tflops


def format_table(rows: list[Row], device_line: str) -> str:
    lines = [device_line, "",
             "| kernel | shape | ours (us) | baseline | baseline (us) | figure | target | met "
             "| checked |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        lines.append(f"| {r.kernel} | {r.shape} | {r.ours_us:.1f} | {r.baseline} "
                     f"| {r.baseline_us:.1f} | {r.figure} | {r.target} | {met} "
                     f"| {'yes' if r.checked else 'FAILED'} |")
    return "\n".join(lines)
