"""Real multi-process Megatron Core runs on CPU, trained once per test session and shared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workbench.config import RunConfig

pytestmark = pytest.mark.integration

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


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))
