"""The explorer's first figure of a statistic chosen just after opening, while the background pass runs.

    cd benchmarks && python chosen_during_background.py [--repeats 3] [--dir /tmp/workbench-scale]

Each repeat in a fresh process (a kernel that has just opened the explorer): open the 10,000 x 1,000 pair
(``scale.ensure_pair``), choose the statistic ``min`` at once, then wait for the background. Prints the
time to the heatmap (the first figure, ``last_update_s``) and to the end of the change (the site's detail
drawn too). To compare with an earlier revision, run it with that revision's package first on the path,
alternating, e.g.::

    git worktree add /tmp/before REV
    for i in 1 2 3; do PYTHONPATH=/tmp/before python chosen_during_background.py --repeats 1
                       python chosen_during_background.py --repeats 1; done
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scale import ensure_pair, pair_parser

_ONE = '''
import sys, time
from pathlib import Path
import plotly.graph_objects as go
go.FigureWidget  # plotly's widget module, imported before the clock starts
from workbench.widgets.explorer import DivergenceExplorer
folder = Path(sys.argv[1])
start = time.perf_counter()
explorer = DivergenceExplorer(folder, reference="a", other="b")
opened = time.perf_counter() - start
start = time.perf_counter()
explorer.stat.value = "min"
chosen = time.perf_counter() - start
heatmap = explorer.last_update_s  # the heatmap drawn, before the site's detail
explorer.workspace.preloaded()
print(f"{opened:.3f} {heatmap:.3f} {chosen:.3f} {time.perf_counter() - start:.3f}")
'''


def main() -> None:
    args = pair_parser(__doc__.splitlines()[0], repeats=3).parse_args()
    a, _, _ = ensure_pair(args.dir, args.steps, args.sites)
    import workbench

    print(f"workbench from {Path(workbench.__file__).parent}; {args.steps} x {args.sites}")
    for _ in range(args.repeats):
        done = subprocess.run([sys.executable, "-c", _ONE, str(a.parent)], capture_output=True, text=True,
                              check=True)
        opened, heatmap, chosen, background = (float(x) for x in done.stdout.split()[-4:])
        print(f"open {opened:.2f} s; a statistic chosen at once: its heatmap in {1000 * heatmap:.0f} ms, with the "
              f"site's detail {1000 * chosen:.0f} ms; the background done {background:.1f} s after", flush=True)


if __name__ == "__main__":
    main()
