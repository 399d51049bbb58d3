"""Small helpers shared by the benchmarks: percentiles and a uniform result line."""

import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], pct: float) -> float:
    """The `pct` percentile (0..100) by the nearest-rank method; 0.0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary_ms(samples_s: Sequence[float]) -> str:
    ms = [s * 1000 for s in samples_s]
    mean = statistics.fmean(ms) if ms else 0.0
    return f"p50={percentile(ms, 50):.2f}ms p99={percentile(ms, 99):.2f}ms mean={mean:.2f}ms n={len(ms)}"


def ratio_line(name: str, measured: float, baseline: float, unit: str) -> str:
    ratio = measured / baseline if baseline else float("nan")
    return f"{name}: {measured:,.1f} {unit} vs baseline {baseline:,.1f} {unit} -> ratio {ratio:.3f}"
