"""How fast ``workbench import-megatron-dumps`` reads Megatron-LM's tensor dumps, in MB of dump per second.

    python benchmarks/import_dumps.py [--layers 4] [--hidden 512] [--seq 512] [--batch 2] [--tp 2]
                                      [--iterations 4] [--repeats 3]

Writes, in Megatron-LM's format and naming, the four dump kinds of a GPT of that size (each layer's linear_qkv,
linear_proj, linear_fc1 and linear_fc2: their inputs and outputs, the gradients of both, the weights and their
gradients) for ``--iterations`` iterations at ``--tp``, then imports the folder ``--repeats`` times and prints
the median seconds and MB/s; beside it, the median seconds of only reading the same files
(``load_torch_tensors``), the floor any import has.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from workbench.megatron_lm.dumps import import_megatron_dumps
from workbench.untrusted import load_torch_tensors


def write_dumps(save: Path, *, layers: int, hidden: int, seq: int, batch: int, tp: int, iterations: int) -> int:
    """The dump folder; returns its size in bytes."""
    generator = torch.Generator().manual_seed(0)
    ffn = 4 * hidden

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    for iteration in range(1, iterations + 1):
        for rank in range(tp):
            params, activations = {}, {}
            for n in range(layers):
                prefix = f"decoder.layers.{n}"
                params.update({f"{prefix}.self_attention.linear_qkv.weight": t(3 * hidden // tp, hidden),
                               f"{prefix}.self_attention.linear_proj.weight": t(hidden, hidden // tp),
                               f"{prefix}.mlp.linear_fc1.weight": t(ffn // tp, hidden),
                               f"{prefix}.mlp.linear_fc2.weight": t(hidden, ffn // tp)})
                for module, inputs, outputs in (("self_attention.linear_qkv", hidden, 3 * hidden // tp),
                                                ("self_attention.linear_proj", hidden // tp, hidden),
                                                ("mlp.linear_fc1", hidden, ffn // tp),
                                                ("mlp.linear_fc2", ffn // tp, hidden)):
                    activations[f"{prefix}.{module}/input0"] = t(seq, batch, inputs)
                    activations[f"{prefix}.{module}/output0"] = t(seq, batch, outputs)
            for kind, content in (("params", params), ("wgrads", params), ("activations", activations),
                                  ("dgrads", activations)):
                folder = save / kind / f"iter_{iteration:07d}"
                folder.mkdir(parents=True, exist_ok=True)
                torch.save({"model_chunk0": content}, folder / f"mp_rank_{rank:02d}.pth")
    return sum(p.stat().st_size for p in save.rglob("*.pth"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 4), ("hidden", 512), ("seq", 512), ("batch", 2), ("tp", 2),
                          ("iterations", 4), ("repeats", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        size = write_dumps(root / "save", layers=args.layers, hidden=args.hidden, seq=args.seq, batch=args.batch,
                           tp=args.tp, iterations=args.iterations)
        shape = f"L{args.layers} H{args.hidden} seq {args.seq} batch {args.batch}"
        print(f"wrote {size / 1e6:.0f} MB of dumps ({args.iterations} iterations x 4 kinds x {args.tp} ranks; "
              f"{shape}) in {time.perf_counter() - start:.1f} s", flush=True)
        files = sorted((root / "save").rglob("*.pth"))
        imports, reads = [], []
        for repeat in range(args.repeats):
            begin = time.perf_counter()
            for path in files:
                load_torch_tensors(path)
            reads.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            import_megatron_dumps(root / "save", root / f"run-{repeat}", progress=lambda line: None)
            imports.append(time.perf_counter() - begin)
            print(f"repeat {repeat + 1}/{args.repeats}: import {imports[-1]:.2f} s, read alone {reads[-1]:.2f} s",
                  flush=True)
        seconds, read = statistics.median(imports), statistics.median(reads)
        print(f"\nimport: {seconds:.2f} s, {size / 1e6 / seconds:.0f} MB/s of dump (median of {args.repeats}); "
              f"reading the files alone: {read:.2f} s, {size / 1e6 / read:.0f} MB/s")


if __name__ == "__main__":
    main()
