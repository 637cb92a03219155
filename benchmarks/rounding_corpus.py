"""The bug-or-rounding corpus: known layout bugs and known-correct changes, each judged by ``workbench verdict``.

    python benchmarks/rounding_corpus.py [--out build/corpus] [--part user-loop|runner|all]   (``make corpus``)

Two halves, on the CPU:

* **A user's own loop** (tests/integration/user_loop.py, recorded with ``record()``): a TP=1 reference, eight band
  runs of it (``record(..., perturb="fp32")``; six make the band, two are held out), the correct TP=2 and TP=2 with
  sequence parallelism, and the loop's six layout bugs (``user_loop.BUGS``), each injected at TP=2 on one rank or
  one parameter. Each bug is also compared with the correct run of its own layout: where ``compare`` finds it
  first is where the verdict must name it.
* **The runner** (benchmarks/corpus/runner.toml): a TP=1 reference, its band runs of fp32's and of bf16's rounding,
  the correct layouts the runner supports (TP=2, TP=2 + SP, PP=2, PP=2 x VP=2, DP=2 with and without the
  distributed optimizer and overlap), bf16 against bf16's band, its four layout bugs (``config.LAYOUT_BUGS``) and an
  injected scale of one module's output; and (runner_moe.toml) a MoE model's reference, its band runs and EP=2.

It prints the confusion table (case, what it is, the verdict, where, by how many tolerances) and writes it, as
Markdown, to OUT/corpus.md, with each half's wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.training import train_user_loop  # noqa: E402
from workbench.analysis.compare import compare  # noqa: E402
from workbench.analysis.rounding import RoundingBand, RoundingVerdict, judge, rounding_band  # noqa: E402
from workbench.config import LAYOUT_BUGS  # noqa: E402
from workbench.store.reader import Run, open_run  # noqa: E402

STEPS = ("--steps", "8", "--eval-every", "0")
BAND, HELD_OUT = 6, 2
CALIBRATION_RUNS, DRAWS = 16, 8
"""Band runs of the user loop for the calibration: DRAWS random bands of 4, 6 and 8 of them, the rest held out."""
USER_BUGS = {"tp_partial_scale": ("--tp", "2"), "sp_norm_unreduced": ("--tp", "2", "--sp"),
             "replica_not_updated": ("--tp", "2"), "loss_scaled_twice": ("--tp", "2"),
             "attention_scale": ("--tp", "2"), "tp_grad_averaged": ("--tp", "2")}
USER_CORRECT = {"tp2": ("--tp", "2"), "tp2-sp": ("--tp", "2", "--sp")}
RUNNER_BUGS = list(LAYOUT_BUGS)
"""The runner's layout bugs (benchmarks/corpus/runner.toml): each a run at TP=2 with ``fault.kind = "layout_bug"``."""


def final_l2(reference: object, run: object) -> float:
    """Median over sites of the relative L2 difference at the last common step."""
    result = compare(reference, run)
    last = result.relative_difference.sel(stat="l2").isel(step=-1).to_numpy().astype(float)
    return float(np.nanmedian(last)) if np.isfinite(last).any() else 0.0


def row(case: str, kind: str, expected: str, verdict: object, l2: float, where: tuple[int | None, str | None]
        ) -> dict[str, object]:
    return {"case": case, "kind": kind, "expected": expected,
            "verdict": "within" if verdict.within else "beyond",
            "right": ("within" if verdict.within else "beyond") == expected,
            "first": "-" if verdict.within else f"{verdict.first_step} {verdict.first_site}",
            "ratio": verdict.first_ratio if not verdict.within else verdict.worst_ratio,
            "compare_first": "-" if where[0] is None else f"{where[0]} {where[1]}", "final_l2": l2,
            "analytic": f"{int(verdict.analytic['beyond'].sum())} of {len(verdict.analytic)}"
            if not verdict.analytic.empty else "-"}


def user_loop(out: Path) -> list[dict[str, object]]:
    out.mkdir(parents=True, exist_ok=True)
    train = [("ref", (), 1)] + [(f"band{i}", ("--perturb", "fp32"), 1) for i in range(CALIBRATION_RUNS)]
    train += [(name, args, 2) for name, args in USER_CORRECT.items()]
    train += [(f"bug-{bug}", (*args, "--bug", bug), 2) for bug, args in USER_BUGS.items()]
    for name, args, ranks in train:
        if not (out / name / "run.zarr").exists():
            print(f"user loop: {name}", flush=True)
            train_user_loop(out / name, *STEPS, *args, ranks=ranks)
    runs = {name: open_run(out / name) for name, _, _ in train}
    records = {name: run.records() for name, run in runs.items()}
    reference = records["ref"]
    band = rounding_band(reference, [records[f"band{i}"] for i in range(BAND)])
    rows = [row(f"band{i}", "held-out band run", "within", judge(records[f"band{i}"], reference, band),
                final_l2(reference, records[f"band{i}"]), (None, None)) for i in range(BAND, BAND + HELD_OUT)]
    rows += [row(name, "correct layout", "within", judge(records[name], reference, band,
                                                         replicas_parted=runs[name].manifest.replicas_parted),
                 final_l2(reference, records[name]), (None, None)) for name in USER_CORRECT]
    for bug, args in USER_BUGS.items():
        correct = "tp2-sp" if "--sp" in args else "tp2"
        found = compare(records[correct], records[f"bug-{bug}"])
        parted = runs[f"bug-{bug}"].manifest.replicas_parted  # where the TP ranks' copies of a tensor parted
        rows.append(row(f"bug-{bug}", f"layout bug (against {correct})", "beyond",
                        judge(records[f"bug-{bug}"], reference, band, replicas_parted=parted),
                        final_l2(records[correct], records[f"bug-{bug}"]), (found.first_step, found.first_site)))
    return rows


def swept(study: str, out: Path, last: str) -> dict[str, Run]:
    """The runs of ``benchmarks/corpus/STUDY.toml``, swept into ``out`` unless its ``last`` run is there already."""
    from workbench.cli import main as cli

    if not (out / last / "run.zarr").exists():
        if cli(["sweep", str(ROOT / "benchmarks" / "corpus" / f"{study}.toml"), "--out", str(out)]) != 0:
            raise SystemExit(f"the sweep of {study}.toml failed")
    return {path.name: open_run(path) for path in sorted(out.iterdir()) if (path / "run.zarr").exists()}


def calibration(out: Path) -> str:
    """How often a run held out of a random band lies beyond it: with the margin the left-out runs give
    (``HELD_OUT_FACTOR`` 1) and with the margin the workbench uses (2), for bands of 4, 6 and 8 runs; and the
    smallest ratio at which a bug is first found, which and where (from the statistics alone: the replicas'
    hashes left out)."""
    import dataclasses
    import random

    from workbench.analysis.rounding import HELD_OUT_FACTOR, MIN_MARGIN

    records = {path.name: open_run(path).records() for path in sorted(out.iterdir()) if (path / "run.zarr").exists()}
    reference, names = records["ref"], [f"band{i}" for i in range(CALIBRATION_RUNS)]
    correct = [*names, *USER_CORRECT]
    rng = random.Random(0)
    lines = ["| band runs | margin (range) | held-out and correct runs beyond, factor 1 | beyond, factor "
             f"{HELD_OUT_FACTOR:g} | largest ratio, factor {HELD_OUT_FACTOR:g} | smallest bug ratio |",
             "|---|---|---|---|---|---|"]
    for size in (4, 6, 8):
        beyond_one = beyond = judged = 0
        worst, bug_low, margins, weakest = 0.0, float("inf"), [], ""
        for _ in range(DRAWS):
            chosen = rng.sample(names, size)
            band = rounding_band(reference, [records[n] for n in chosen])
            plain = dataclasses.replace(band, margin=max(MIN_MARGIN, float(band.calibration["worst"].max())))
            margins.append(band.margin)
            for name in (n for n in correct if n not in chosen):
                judged += 1
                beyond_one += not judge(records[name], reference, plain).within
                verdict = judge(records[name], reference, band)
                beyond += not verdict.within
                worst = max(worst, verdict.worst_ratio)
            for bug in USER_BUGS:
                verdict = judge(records[f"bug-{bug}"], reference, band)
                ratio = 0.0 if verdict.within else verdict.first_ratio
                if ratio < bug_low:
                    bug_low, weakest = ratio, f"{bug} at {verdict.first_step} {verdict.first_site}"
        lines.append(f"| {size} | {min(margins):.2g}-{max(margins):.2g} | {beyond_one} of {judged} | {beyond} of "
                     f"{judged} | {worst:.2f} | {bug_low:.3g} ({weakest}) |")
    return "\n".join(lines)


def runner(out: Path) -> list[dict[str, object]]:
    runs = swept("runner", out, "bug-tp_grad_averaged")
    records = {name: run.records() for name, run in runs.items()}
    reference = records["ref"]
    fp32 = rounding_band(reference, [records[f"band-r{i}"] for i in range(BAND)])
    bf16 = rounding_band(reference, [records[f"band-bf16-r{i}"] for i in range(BAND)], precision="bf16")

    def judged(name: str, band: RoundingBand = fp32) -> RoundingVerdict:
        return judge(records[name], reference, band, replicas_parted=runs[name].manifest.replicas_parted)

    rows = [row(f"band-r{i}", "held-out band run", "within", judged(f"band-r{i}"),
                final_l2(reference, records[f"band-r{i}"]), (None, None)) for i in range(BAND, BAND + HELD_OUT)]
    for name in ("tp2", "tp2-sp", "pp2", "pp2-vp2", "dp2", "dp2-zero1"):
        rows.append(row(name, "correct layout", "within", judged(name), final_l2(reference, records[name]),
                        (None, None)))
    rows.append(row("bf16", "correct precision (bf16 band)", "within", judged("bf16", bf16),
                    final_l2(reference, records["bf16"]), (None, None)))
    rows.append(row("bf16 vs fp32 band", "precision held to fp32's rounding", "beyond", judged("bf16"),
                    final_l2(reference, records["bf16"]), (None, None)))
    for bug in RUNNER_BUGS:
        correct = "tp2-sp" if bug == "sp_norm_unreduced" else "tp2"
        found = compare(records[correct], records[f"bug-{bug}"])
        rows.append(row(f"bug-{bug}", f"layout bug (against {correct})", "beyond", judged(f"bug-{bug}"),
                        final_l2(records[correct], records[f"bug-{bug}"]), (found.first_step, found.first_site)))
    found = compare(reference, records["scaled-mlp"])
    rows.append(row("scaled-mlp", "fault: act:layers.2.mlp x 1.001 at step 1", "beyond", judged("scaled-mlp"),
                    final_l2(reference, records["scaled-mlp"]), (found.first_step, found.first_site)))
    moe = {name: run.records() for name, run in swept("runner_moe", out.parent / "runner-moe", "ep2").items()}
    band = rounding_band(moe["ref"], [moe[f"band-r{i}"] for i in range(BAND)])
    rows += [row(f"moe band-r{i}", "held-out band run (MoE)", "within", judge(moe[f"band-r{i}"], moe["ref"], band),
                 final_l2(moe["ref"], moe[f"band-r{i}"]), (None, None)) for i in range(BAND, BAND + HELD_OUT)]
    rows.append(row("moe ep2", "correct layout (EP=2, DP=2)", "within", judge(moe["ep2"], moe["ref"], band),
                    final_l2(moe["ref"], moe["ep2"]), (None, None)))
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    lines = ["| case | what it is | expected | verdict | right | first beyond (step, site) | tolerances there "
             "(worst, when within) | compare's first (step, site) | final rel. L2 | gradients beyond the analytic "
             "bound, step 0 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['kind']} | {r['expected']} | {r['verdict']} | {'yes' if r['right'] else 'NO'}"
                     f" | {r['first']} | {r['ratio']:.3g} | {r['compare_first']} | {r['final_l2']:.2g} "
                     f"| {r['analytic']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "corpus")
    parser.add_argument("--part", choices=("user-loop", "runner", "all"), default="all")
    args = parser.parse_args()
    sections = []
    for part, make in (("user-loop", user_loop), ("runner", runner)):
        if args.part not in (part, "all"):
            continue
        start = time.perf_counter()
        rows = make(args.out / part)
        seconds = time.perf_counter() - start
        table = markdown(rows)
        right = sum(bool(r["right"]) for r in rows)
        sections.append(f"## {part}: {right} of {len(rows)} right ({seconds:.0f} s)\n\n{table}\n")
        print(sections[-1], flush=True)
        if part == "user-loop":
            sections.append(f"## calibration ({DRAWS} random bands of each size)\n\n"
                            f"{calibration(args.out / part)}\n")
            print(sections[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "corpus.md").write_text("\n".join(sections))
    print(f"wrote {args.out / 'corpus.md'}")


if __name__ == "__main__":
    main()
