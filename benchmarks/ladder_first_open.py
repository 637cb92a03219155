"""The ladder widget as the first thing a fresh process opens, on the 10,000 x 1,000 pair.

    cd benchmarks && python ladder_first_open.py [--repeats 4] [--dir /tmp/workbench-scale] [--no-huge-pages]

Each repeat in a fresh process (a kernel that has just imported the widgets): make one plotly
``FigureWidget``, then time ``LadderWidget(folder, runs=["b"])`` (opening the folder and drawing the first
ladder), then wait for its background. ``--no-huge-pages`` switches numpy's request for transparent huge
pages off in the measuring process first (``np._core.multiarray._set_madvise_hugepage(False)``): where the
kernel assembles huge pages when they are first asked for, a process's first large arrays are slower than
its later ones. To compare with an earlier revision, alternate as ``chosen_during_background.py`` says.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scale import ensure_pair, pair_parser

_ONE = '''
import sys, time
import numpy as np
if sys.argv[2] == "off":
    np._core.multiarray._set_madvise_hugepage(False)
import plotly.graph_objects as go
from workbench.widgets.ladder import LadderWidget
go.FigureWidget()
start = time.perf_counter()
widget = LadderWidget(sys.argv[1], runs=["b"])
opened = time.perf_counter() - start
widget.workspace.preloaded()
print(f"{opened:.3f} {time.perf_counter() - start:.3f}")
'''


def main() -> None:
    parser = pair_parser(__doc__.splitlines()[0], repeats=4)
    parser.add_argument("--no-huge-pages", action="store_true", help="numpy's huge pages off in the measuring process")
    args = parser.parse_args()
    a, _, _ = ensure_pair(args.dir, args.steps, args.sites)
    import workbench

    print(f"workbench from {Path(workbench.__file__).parent}; {args.steps} x {args.sites}; numpy's huge pages "
          f"{'off' if args.no_huge_pages else 'as numpy sets them'}")
    for _ in range(args.repeats):
        done = subprocess.run([sys.executable, "-c", _ONE, str(a.parent), "off" if args.no_huge_pages else "on"],
                              capture_output=True, text=True, check=True)
        opened, background = (float(x) for x in done.stdout.split()[-2:])
        print(f"ladder open and drawn in {opened:.2f} s; its background done {background:.1f} s after opening",
              flush=True)


if __name__ == "__main__":
    main()
