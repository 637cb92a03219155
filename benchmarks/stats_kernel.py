"""Statistics-and-fingerprint kernel efficiency against a plain reduction and a copy.

    python benchmarks/stats_kernel.py [--sizes 1 16 64] [--repeats 7] [--isa native|avx2|scalar]

For 1 M, 16 M and 64 M-element fp32 and bf16 tensors on the CPU, prints the elements per
second of the statistics + fingerprint pass on each path -- the native one-pass kernel
(what the recorder uses on CPU), the ``torch.compile`` kernel, and the same computation as
separate eager torch calls -- and, beside each, its ratio to the elements per second of a
plain ``torch.sum`` of an fp32 tensor of the same length, measured in the same loop
(medians of interleaved repeats); also the bytes per second of ``tensor.clone()``. It
checks that every path gives the same fingerprint, and that the native kernel gives the
same statistics with 1 thread as with all of them. ``--isa`` measures the native kernel held to
AVX2 or to scalar code (the paths of other machines) instead of this machine's own.
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
    parser.add_argument("--isa", choices=kernels.ISAS, default="native")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, native pass: "
          f"{kernels.native(args.isa).instruction_set()}")
    print("G elements/s; ratio: to an fp32 torch.sum of the same length")
    print(f"{'dtype':>9} {'elements':>9} {'copy GB/s':>10} {'sum':>6} | {'native':>6} {'ratio':>6} | "
          f"{'compiled':>8} {'ratio':>6} | {'eager':>6} {'ratio':>6} | same fingerprint | threads agree")
    compiled, eager = kernels.compiled(), kernels.eager()

    module = kernels.native(args.isa)

    def native(x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        acc, lanes = kernels.new_accumulators(x.device)
        module.accumulate(x, coords, 1e-38, 1e38, acc, lanes)
        return lanes & 0xFFFFFFFF

    for dtype in (torch.float32, torch.bfloat16):
        for millions in args.sizes:
            x = torch.randn(millions * 2**20).to(dtype)
            coords = kernels.identity_coords(x.shape)
            fingerprints = [native(x, coords),  # the first calls build / compile once
                            kernels.partial_stats(x, coords, 1e-38, 1e38, fn=compiled)[2] & 0xFFFFFFFF,
                            kernels.partial_stats(x, coords, 1e-38, 1e38, fn=eager)[2] & 0xFFFFFFFF]
            reference = torch.randn(x.numel())  # fp32, the same length
            copy_t, sum_t, native_t, compiled_t, eager_t = [], [], [], [], []
            for _ in range(args.repeats):  # interleaved, so drift hits all paths alike
                copy_t += seconds(lambda x=x: x.clone(), 1)
                sum_t += seconds(lambda r=reference: r.sum(), 1)
                native_t += seconds(lambda x=x, c=coords: native(x, c), 1)
                compiled_t += seconds(lambda x=x, c=coords: kernels.partial_stats(x, c, 1e-38, 1e38, fn=compiled), 1)
                eager_t += seconds(lambda x=x, c=coords: kernels.partial_stats(x, c, 1e-38, 1e38, fn=eager), 1)
            copy_gbs = x.nbytes / statistics.median(copy_t) / 1e9
            rates = [x.numel() / statistics.median(t) / 1e9 for t in (sum_t, native_t, compiled_t, eager_t)]
            same = all(torch.equal(f, fingerprints[0]) for f in fingerprints)
            threads = torch.get_num_threads()
            acc_all, _ = kernels.new_accumulators(x.device)
            module.accumulate(x, coords, 1e-38, 1e38, acc_all, kernels.new_accumulators(x.device)[1])
            torch.set_num_threads(1)
            acc_one, _ = kernels.new_accumulators(x.device)
            module.accumulate(x, coords, 1e-38, 1e38, acc_one, kernels.new_accumulators(x.device)[1])
            torch.set_num_threads(threads)
            print(f"{str(dtype).removeprefix('torch.'):>9} {millions:>8}M {copy_gbs:10.2f} {rates[0]:6.2f} | "
                  f"{rates[1]:6.2f} {rates[1] / rates[0]:6.2f} | {rates[2]:8.2f} {rates[2] / rates[0]:6.2f} | "
                  f"{rates[3]:6.2f} {rates[3] / rates[0]:6.2f} | {same!s:>16} | {torch.equal(acc_all, acc_one)}")


if __name__ == "__main__":
    main()
