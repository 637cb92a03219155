"""Training for the tests: the tiny runner config, runs trained once per session, the layouts they are
trained at, and a researcher's own loop (``tests/integration/user_loop.py``) run under torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from workbench.config import RunConfig

TINY: dict[str, Any] = {
    "name": "tiny",
    "steps": 4,
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "checkpoint_every": 1,
    "flush_every": 2,
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128, "seq_length": 32},
    "optim": {"lr": 0.01, "min_lr": 0.001, "warmup_steps": 2},
    # Eager statistics: each rank process would otherwise compile the kernel first
    # (test_recorder checks that the compiled path gives the same fingerprints).
    "record": {"compile": False},
}


def tiny_config(name: str, **overrides: Any) -> RunConfig:
    return RunConfig.from_dict(TINY).with_overrides({"name": name, **overrides})


NAMED: dict[str, dict[str, Any]] = {
    # A repeat that computes its validation loss after every step (the base run only after the last):
    # evaluating must change no training number, so the two are still bitwise repeats.
    "base-repeat": {"eval.every": 1},
}


class Runs:
    """Trains each named config once per session (with its ``NAMED`` overrides); later requests reuse
    the run folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, Path] = {}

    def get(self, name: str, **overrides: Any) -> Path:
        from workbench.runner.launch import launch

        if name not in self._done:
            self._done[name] = launch(tiny_config(name, **{**NAMED.get(name, {}), **overrides}), self.root / name)
        return self._done[name]


LAYOUTS = {
    "tp2": {"layout.tp": 2},
    "pp2": {"layout.pp": 2},
    "dp2": {"layout.dp": 2},
    "tp2pp2": {"layout.tp": 2, "layout.pp": 2},
}
"""The parallel layouts the integration tests train beside the TP=1 PP=1 DP=1 ``base`` run."""

USER_LOOP = Path(__file__).parents[1] / "integration" / "user_loop.py"
"""A researcher's own Megatron Core loop, recorded with ``workbench.recorder.record``."""


def train_user_loop(run_dir: Path, *args: str, ranks: int = 2, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``user_loop.py`` on ``ranks`` processes (torchrun, gloo); with ``ok``, assert it succeeded."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                             str(ranks), str(USER_LOOP), str(run_dir), *args], capture_output=True, text=True,
                            timeout=900)
    if ok:
        assert result.returncode == 0, result.stderr[-4000:]
    return result
