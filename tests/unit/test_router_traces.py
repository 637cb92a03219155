"""Megatron's MoE router traces (``--moe-routing-trace-path``) imported by ``workbench import-megatron-dumps
--router-traces``: written by Megatron's own ``RouterTracer`` where megatron-core has it (0.19+), and in its
documented format by hand: each micro-batch's choices become the recorder's ``tokens_per_expert`` and the
bitwise ``router/top_indices``, two runs' routing compares step by step, and a bad line is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.dumps import (
    EXPERTS,
    LAYERS,
    MICRO_BATCHES,
    RANKS,
    STEPS,
    TOKENS,
    TOPK,
    router_choices,
    write_router_traces,
)
from workbench.analysis.compare import compare
from workbench.cli import main
from workbench.megatron_lm.dumps import import_megatron_dumps
from workbench.statistics import fingerprint_reference
from workbench.store.reader import open_run


def _import(traces: Path, run: Path) -> Path:
    return import_megatron_dumps(traces, run, router_traces=traces, experts=EXPERTS, progress=lambda line: None)


def test_each_micro_batch_s_choices_are_the_recorder_s_counts_and_top_indices(tmp_path: Path) -> None:
    choices = router_choices()
    records = open_run(_import(write_router_traces(tmp_path / "traces", choices), tmp_path / "run")).records()
    assert records.steps == [0, 1, 2]
    assert list(records.sites) == [f"act:layers.{layer}.mlp.{what}" for layer in range(LAYERS)
                                   for what in ("tokens_per_expert", "router/top_indices")]
    for step in range(STEPS):
        for layer in range(LAYERS):
            # rows: replica 0's micro-batches, then replica 1's (the recorder's sample order)
            rows = choices[step, layer].reshape(RANKS * MICRO_BATCHES, TOKENS, TOPK)
            counts = np.stack([np.bincount(r.reshape(-1).numpy(), minlength=EXPERTS) for r in rows])
            assert int(records.fingerprints.at[step, f"act:layers.{layer}.mlp.tokens_per_expert"]) == \
                fingerprint_reference(counts.astype(np.float32))
            assert int(records.fingerprints.at[step, f"act:layers.{layer}.mlp.router/top_indices"]) == \
                fingerprint_reference(rows.numpy().astype(np.float64))


def test_two_tokens_that_swap_experts_are_found_though_the_counts_agree(tmp_path: Path) -> None:
    choices = router_choices()
    swapped = choices.clone()
    swapped[1, 1, 0, 0, [0, 1]] = choices[1, 1, 0, 0, [1, 0]]  # step 1, layer 1: tokens 0 and 1 trade choices
    assert not torch.equal(swapped, choices)
    a = open_run(_import(write_router_traces(tmp_path / "a", choices), tmp_path / "ra")).records()
    again = open_run(_import(write_router_traces(tmp_path / "again", choices), tmp_path / "ragain")).records()
    b = open_run(_import(write_router_traces(tmp_path / "b", swapped), tmp_path / "rb")).records()
    assert compare(a, again).identical
    result = compare(a, b)
    assert (result.first_step, result.first_site) == (1, "act:layers.1.mlp.router/top_indices")
    assert a.fingerprints.at[1, "act:layers.1.mlp.tokens_per_expert"] == \
        b.fingerprints.at[1, "act:layers.1.mlp.tokens_per_expert"]


def test_megatron_s_own_tracer_writes_what_the_import_reads(tmp_path: Path) -> None:
    router_trace = pytest.importorskip("megatron.core.transformer.moe.router_trace",
                                       reason="megatron-core before 0.19 has no router tracer")
    choices = router_choices(1)
    for rank in range(RANKS):
        tracer = router_trace.RouterTracer(str(tmp_path / "traces"), STEPS, rank, training_mode=True)
        for step in range(STEPS):
            for k in range(MICRO_BATCHES):  # one call per micro-batch, every layer, as the router hooks make
                tracer.record_indices([choices[step, layer, rank, k] for layer in range(LAYERS)])
            tracer.advance_step(step)  # train_step's call, with its 0-based iteration
        tracer.flush()
    by_hand = write_router_traces(tmp_path / "by-hand", choices)
    traced = open_run(_import(tmp_path / "traces", tmp_path / "run")).records()
    assert compare(traced, open_run(_import(by_hand, tmp_path / "run-by-hand")).records()).identical
    assert traced.steps == [0, 1, 2]


def test_an_evaluation_s_calls_are_dropped_and_its_step_named(tmp_path: Path) -> None:
    traces = write_router_traces(tmp_path / "traces", router_choices())
    for rank in range(RANKS):  # an evaluation forward before step 2's training calls, stamped step 2
        log = traces / f"router_trace_rank{rank}.jsonl"
        lines = log.read_text().splitlines()
        first = next(i for i, line in enumerate(lines) if json.loads(line)["step"] == 2)
        extra = [json.dumps({**json.loads(lines[first + layer]), "top_indices": [[0, 1]] * TOKENS})
                 for layer in range(LAYERS)]
        log.write_text("\n".join(lines[:first] + extra + lines[first:]) + "\n")
    run = open_run(_import(traces, tmp_path / "run"))
    assert run.attrs["imported"]["router_traces"]["irregular_steps"] == [2]
    plain_traces = write_router_traces(tmp_path / "plain", router_choices())
    plain = open_run(_import(plain_traces, tmp_path / "plain-run")).records()
    assert compare(run.records(), plain).identical


@pytest.mark.parametrize("line, says", [
    ('{"step": -1, "block": "decoder", "layer": 0, "top_indices": [[1, 2]]}', "not a router-trace record"),
    ('{"step": 0, "block": "decoder", "layer": 0, "top_indices": [[1, 2], [3]]}', "not a router-trace record"),
    ("{not json", "not a JSON line"),
    ('{"step": 0, "block": "decoder", "layer": 0, "top_indices": [[1, 9]]}', "routes to expert 9 of 4"),
])
def test_a_bad_trace_line_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
                                                 says: str) -> None:
    traces = write_router_traces(tmp_path / "traces", router_choices())
    with (traces / "router_trace_rank1.jsonl").open("a") as log:
        log.write(line + "\n")
    code = main(["import-megatron-dumps", str(traces), "--router-traces", str(traces), "--experts", "4",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_folder_without_traces_and_a_pipeline_without_dumps_are_refused(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["import-megatron-dumps", str(tmp_path / "empty"), "--router-traces", str(tmp_path / "empty"),
                 "--out", str(tmp_path / "run")]) == 2
    assert "no router traces" in capsys.readouterr().err
    traces = write_router_traces(tmp_path / "traces", router_choices())
    assert main(["import-megatron-dumps", str(traces), "--router-traces", str(traces), "--pp", "2",
                 "--out", str(tmp_path / "run")]) == 2
    assert "stages' first layers are unknown" in capsys.readouterr().err
