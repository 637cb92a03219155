"""Typed manifests of made-up runs, as a user loop writes them: roles and environments come from these fields."""

from __future__ import annotations

from workbench.store.manifest import ModelSignature, ParallelLayout, RunManifest

MODEL = ModelSignature(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=32)


def info(name: str, *, deterministic: bool = True, precision: str = "fp32", seed: int = 1, tp: int = 1,
         **facts: object) -> RunManifest:
    """A user loop's typed manifest (roles come from these fields, never from the name)."""
    return RunManifest(run_id=f"{name}-1", name=name, producer="user loop", model=MODEL,
                       layout=ParallelLayout(tp=tp), precision=precision, deterministic=deterministic, seed=seed,
                       **facts)  # type: ignore[arg-type]
