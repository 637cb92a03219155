"""Peak memory of `workbench import-te` against the size of the log it reads.

    python benchmarks/import_memory.py [--megabytes 200] [--line short|te]

Writes a Transformer Engine debug log (``nvdlfw_inspect`` statistics lines) of about ``--megabytes`` MB: ``short``
lines are the shortest such lines (``l0_output_min iteration=0 value=0.1234``, 40 bytes, the worst case for memory
per byte), ``te`` lines are of the length TE writes (about 120 bytes, with its prefix). Then runs
``workbench import-te`` on it in a process of its own and prints the log's size, the process's peak resident
memory (``ru_maxrss`` of the child) and their ratio. About 10 s per 200 MB on a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PREFIX = "INFO - 2026-12-07 12:00:00,000 - nvdlfw_inspect - "


def write_log(path: Path, megabytes: float, line: str) -> int:
    """A log of about ``megabytes`` MB of 512 statistics a step; returns its lines."""
    keys = [f"l{layer}_{tensor}_{stat}" for layer in range(32) for tensor in ("output", "weight", "gradient",
            "activation") for stat in ("min", "max", "cur_amax", "l2_norm")]
    prefix = _PREFIX if line == "te" else ""
    written = lines = step = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        while written < megabytes * 1e6:
            chunk = "".join(f"{prefix}{key} iteration={step} value={(step * 7 + i) % 1000 / 997:.4f}\n"
                            for i, key in enumerate(keys))
            out.write(chunk)
            written += len(chunk)
            lines += len(keys)
            step += 1
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=200)
    parser.add_argument("--line", choices=("short", "te"), default="short")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "logs" / "nvdlfw_inspect_statistics_logs" / "nvdlfw_inspect_globalrank-0.log"
        lines = write_log(log, args.megabytes, args.line)
        size = log.stat().st_size
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "workbench", "import-te", str(log.parent.parent), "--out",
                        str(Path(tmp) / "run")], check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kB on Linux
    print(f"log: {size / 1e6:.0f} MB, {lines:,} {args.line} lines")
    print(f"import-te: {seconds:.1f} s, peak resident memory {peak / 1e6:.0f} MB ({peak / size:.2f} x the log)")


if __name__ == "__main__":
    main()
