"""Statistics-and-fingerprint kernel efficiency against a plain tensor copy.

    python benchmarks/stats_kernel.py [--sizes 1 16 64] [--repeats 7]

For 1 M, 16 M and 64 M-element fp32 and bf16 tensors on the CPU, prints the bytes of
tensor read per second by the statistics + fingerprint pass on each path -- the native
one-pass kernel (what the recorder uses on CPU), the ``torch.compile`` kernel, and the
same computation as separate eager torch calls -- divided by the bytes per second of
``tensor.clone()`` measured in the same loop (medians of interleaved repeats). It also
checks that every path gives the same fingerprint.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from workbench.recorder import kernels


def seconds(fn, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64], help="millions of elements")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'dtype':>9} {'elements':>9} {'copy GB/s':>10} | {'native':>6} {'ratio':>6} | {'compiled':>8} "
          f"{'ratio':>6} | {'eager':>6} {'ratio':>6} | same fingerprint")
    compiled, eager = kernels.compiled(), kernels.eager()

    def native(x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        acc, lanes = kernels.new_accumulators(x.device)
        kernels.accumulate(x, coords, 1e-38, 1e38, acc, lanes, fused=True)
        return lanes & 0xFFFFFFFF

    for dtype in (torch.float32, torch.bfloat16):
        for millions in args.sizes:
            x = torch.randn(millions * 2**20).to(dtype)
            coords = kernels.identity_coords(x.shape)
            fingerprints = [native(x, coords),  # the first calls build / compile once
                            kernels.partial_stats(x, coords, 1e-38, 1e38, fn=compiled)[2] & 0xFFFFFFFF,
                            kernels.partial_stats(x, coords, 1e-38, 1e38, fn=eager)[2] & 0xFFFFFFFF]
            copy_t, native_t, compiled_t, eager_t = [], [], [], []
            for _ in range(args.repeats):  # interleaved, so drift hits all paths alike
                copy_t += seconds(lambda x=x: x.clone(), 1)
                native_t += seconds(lambda x=x, c=coords: native(x, c), 1)
                compiled_t += seconds(lambda x=x, c=coords: kernels.partial_stats(x, c, 1e-38, 1e38, fn=compiled), 1)
                eager_t += seconds(lambda x=x, c=coords: kernels.partial_stats(x, c, 1e-38, 1e38, fn=eager), 1)
            gbs = [x.nbytes / statistics.median(t) / 1e9 for t in (copy_t, native_t, compiled_t, eager_t)]
            same = all(torch.equal(f, fingerprints[0]) for f in fingerprints)
            print(f"{str(dtype).removeprefix('torch.'):>9} {millions:>8}M {gbs[0]:10.2f} | {gbs[1]:6.2f} "
                  f"{gbs[1] / gbs[0]:6.2f} | {gbs[2]:8.2f} {gbs[2] / gbs[0]:6.2f} | {gbs[3]:6.2f} "
                  f"{gbs[3] / gbs[0]:6.2f} | {same}")


if __name__ == "__main__":
    main()
