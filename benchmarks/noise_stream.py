"""The cost of secret noise: SecretStream (SHAKE-256, inverse normal CDF) against torch.randn, same run, same sizes.

    .venv/bin/python benchmarks/noise_stream.py [--sizes 100000 2000000] [--repeats 5]

Prints milliseconds per draw of float64 normals and the ratio to torch's Mersenne Twister; run it alone.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from dpsynth.privacy.randomness import SecretStream, fresh_key


def per_call(draw: Callable[[], object], repeats: int) -> float:
    """Seconds per call of ``draw`` (one untimed warm-up call first)."""
    draw()
    start = time.perf_counter()
    for _ in range(repeats):
        draw()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 2_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    stream, generator = SecretStream(fresh_key()), torch.Generator().manual_seed(0)
    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}, threads: {torch.get_num_threads()}")
    for size in args.sizes:
        secret = per_call(lambda n=size: stream.normal(n), args.repeats)
        baseline = per_call(lambda n=size: torch.randn(n, generator=generator, dtype=torch.float64), args.repeats)
        print(f"{size:>10,} normals: SecretStream {secret * 1e3:7.1f} ms, torch.randn {baseline * 1e3:7.1f} ms, "
              f"ratio {secret / baseline:.2f}")


if __name__ == "__main__":
    main()
