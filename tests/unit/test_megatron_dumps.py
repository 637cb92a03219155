"""``workbench import-megatron-dumps`` on dump folders written here in Megatron-LM's documented format (the
real writer's dumps are in tests/integration/test_megatron_dumps.py): TP shards join by the fingerprint's
rule, each dump kind lands at its step, and bad or hostile files are one line and exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.dumps import BATCH, FFN, HIDDEN, SEQ, full_tensors, write_dumps
from workbench.cli import main
from workbench.megatron_lm.dumps import import_megatron_dumps
from workbench.statistics import fingerprint_reference
from workbench.store.reader import open_run


class _Settings:
    """A module argument Megatron pickles beside the tensors (the way a PackedSeqParams would be)."""

    def __init__(self) -> None:
        self.value = 3


class _Hostile:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/workbench-dump-was-run",))


def _activation_fingerprint(x: torch.Tensor) -> int:
    """The recorder's fingerprint of an activation [seq, batch, features]: keyed by its index in [batch, seq,
    features]."""
    full = x.transpose(0, 1).contiguous().numpy()
    return fingerprint_reference(full)


def _quiet(line: str) -> None:
    pass


def test_tp_shards_join_to_the_full_tensors_fingerprints(tmp_path: Path) -> None:
    full = full_tensors()
    one = open_run(import_megatron_dumps(write_dumps(tmp_path / "tp1", 1, full), tmp_path / "one", progress=_quiet))
    two = open_run(import_megatron_dumps(write_dumps(tmp_path / "tp2", 2, full), tmp_path / "two", progress=_quiet))
    a, b = one.records(), two.records()
    assert list(a.sites) == list(b.sites) and (a.fingerprints == b.fingerprints).all().all()
    assert two.manifest.layout.tp == 2
    expected = {"param:layers.0.mlp.linear_fc1.weight": fingerprint_reference(full["fc1.weight"].numpy()),
                "param:layers.0.mlp.linear_fc2.weight": fingerprint_reference(full["fc2.weight"].numpy()),
                "param:layers.0.pre_mlp_layernorm.weight": fingerprint_reference(full["norm.weight"].numpy()),
                "act:layers.0.mlp.linear_fc1/input0": _activation_fingerprint(full["fc1.in"]),
                "act:layers.0.mlp.linear_fc1": _activation_fingerprint(full["fc1.out"]),
                "act:layers.0.mlp.linear_fc2/input0": _activation_fingerprint(full["fc1.out"]),
                "act:layers.0.mlp": _activation_fingerprint(full["fc2.out"])}
    assert {site: int(b.fingerprints.at[1, site]) for site in expected} == expected
    count = b.stats.sel(stat="count", step=1)
    assert int(count.sel(site="param:layers.0.mlp.linear_fc2.weight")) == HIDDEN * FFN  # both shards, once each
    assert int(count.sel(site="act:layers.0.mlp")) == SEQ * BATCH * HIDDEN  # a replica counted once


def test_params_land_at_the_step_they_start_and_activations_at_the_step_they_were_taken(tmp_path: Path) -> None:
    run = open_run(import_megatron_dumps(write_dumps(tmp_path / "save", 1, full_tensors(), iterations=(3,)),
                                         tmp_path / "run", progress=_quiet))
    records = run.records()
    assert records.steps == [2, 3]  # iter_3: activations of step 2, parameters step 3 starts from
    assert np.isnan(records.stats.sel(step=2, site="param:layers.0.mlp.linear_fc1.weight", stat="sum"))
    assert np.isnan(records.stats.sel(step=3, site="act:layers.0.mlp", stat="sum"))
    assert run.status == "complete" and run.steps_completed == 4


def test_a_changed_element_is_the_first_divergence_with_its_input_equal(tmp_path: Path) -> None:
    full = full_tensors()
    changed = {**full, "fc1.out": full["fc1.out"].clone()}
    changed["fc1.out"].view(-1)[5] = torch.nextafter(changed["fc1.out"].view(-1)[5], torch.tensor(np.inf))
    a = import_megatron_dumps(write_dumps(tmp_path / "a", 2, full), tmp_path / "ra", progress=_quiet)
    b = import_megatron_dumps(write_dumps(tmp_path / "b", 2, changed), tmp_path / "rb", progress=_quiet)
    from workbench.analysis.compare import compare

    result = compare(open_run(a).records(), open_run(b).records())
    assert (result.first_step, result.first_site) == (0, "act:layers.0.mlp.linear_fc1")


def test_a_non_tensor_argument_is_skipped_and_named_and_progress_is_shown(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    save = write_dumps(tmp_path / "save", 1, full_tensors(),
                       extra={"decoder.layers.0.mlp.linear_fc1/packed": _Settings(),
                              "decoder.layers.0.mlp.linear_fc1/flag": True})
    assert main(["import-megatron-dumps", str(save), "--out", str(tmp_path / "run")]) == 0
    skipped = open_run(tmp_path / "run").attrs["imported"]["skipped"]
    assert skipped == {"activations: decoder.layers.0.mlp.linear_fc1/packed": f"{__name__}._Settings",
                       "activations: decoder.layers.0.mlp.linear_fc1/flag": "bool"}
    err = capsys.readouterr().err
    assert "iter_0000002 (2/2): 2 files" in err and "MB/s" in err


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("workbench: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_hostile_dump_is_refused_and_never_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = Path("/tmp/workbench-dump-was-run")
    marker.unlink(missing_ok=True)
    save = write_dumps(tmp_path / "save", 1, full_tensors(), extra={"decoder.layers.0.mlp.linear_fc1/x": _Hostile()})
    line = _one_line_exit_2(["import-megatron-dumps", str(save), "--out", str(tmp_path / "run")], capsys)
    assert "refused" in line and "system" in line and not marker.exists()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("change", ["a rank's shard", "a replica's norm", "a later step's norm"])
def test_shards_and_steps_of_one_tensor_that_disagree_in_shape_are_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str) -> None:
    # one TP rank's fc1 shard [11, 8] beside the other's [8, 8] was stored as [16, 8] with exit 0, and a norm
    # weight whose shape changed between iterations was imported as well
    save = write_dumps(tmp_path / "save", 2, full_tensors())
    rank, iteration, key = {"a rank's shard": (1, 1, "decoder.layers.0.mlp.linear_fc1.weight"),
                            "a replica's norm": (1, 1, "decoder.layers.0.pre_mlp_layernorm.weight"),
                            "a later step's norm": (0, 2, "decoder.layers.0.pre_mlp_layernorm.weight")}[change]
    path = save / "params" / f"iter_{iteration:07d}" / f"mp_rank_{rank:02d}.pth"
    content = torch.load(path, weights_only=True)
    content["model_chunk0"][key] = torch.ones(11, 8) if "shard" in change else torch.ones(HIDDEN + 3)
    torch.save(content, path)
    line = _one_line_exit_2(["import-megatron-dumps", str(save), "--out", str(tmp_path / "run")], capsys)
    assert str(path) in line and "mp_rank_0" in line.replace(str(path), "") and "makes a tensor of shape" in line, \
        line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("damage", ["truncated", "keys", "empty", "missing rank", "not a folder"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    save = write_dumps(tmp_path / "save", 2, full_tensors())
    first = save / "activations" / "iter_0000001" / "mp_rank_00.pth"
    if damage == "truncated":
        first.write_bytes(first.read_bytes()[:200])
    elif damage == "keys":
        torch.save({"layers": {"x": torch.ones(2)}}, first)
    elif damage == "empty":
        save = tmp_path / "nothing"
        save.mkdir()
    elif damage == "missing rank":
        first.unlink()
    else:
        save = first
    line = _one_line_exit_2(["import-megatron-dumps", str(save), "--out", str(tmp_path / "run")], capsys)
    expected = {"truncated": "truncated or corrupt", "keys": "not a Megatron-LM dump", "empty": "no Megatron-LM",
                "missing rank": "is missing", "not a folder": "not a folder"}[damage]
    assert expected in line, line
    assert not (tmp_path / "run").exists()


def test_ep_files_give_each_rank_its_own_experts_and_the_dense_tensors_once(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(1)
    experts = [torch.randn(FFN, HIDDEN, generator=generator) for _ in range(4)]
    router, dense_in = torch.randn(4, HIDDEN, generator=generator), torch.randn(SEQ, BATCH, HIDDEN, generator=generator)
    folder = tmp_path / "save" / "params" / "iter_0000001"
    acts = tmp_path / "save" / "activations" / "iter_0000001"
    folder.mkdir(parents=True)
    acts.mkdir(parents=True)
    mlp = "decoder.layers.0.mlp"
    for ep in range(2):  # two local experts per EP rank; the router is a replica on each
        params = {f"{mlp}.router.weight": router.clone(),
                  **{f"{mlp}.experts.local_experts.{k}.linear_fc1.weight": experts[2 * ep + k].clone() for k in (0, 1)}}
        torch.save({"model_chunk0": params}, folder / f"mp_rank_00_{ep:03d}.pth")
        other_replica = dense_in + ep  # EP rank 1 holds another data replica's activations
        torch.save({"model_chunk0": {f"{mlp}.router/input0": other_replica}}, acts / f"mp_rank_00_{ep:03d}.pth")
    run = open_run(import_megatron_dumps(tmp_path / "save", tmp_path / "run", ep=2, progress=_quiet))
    records = run.records()
    assert run.manifest.layout.ep == 2
    for e in range(4):
        assert int(records.fingerprints.at[1, f"param:layers.0.mlp.experts.{e}.linear_fc1.weight"]) == \
            fingerprint_reference(experts[e].numpy())
    assert int(records.fingerprints.at[1, "param:layers.0.mlp.router.weight"]) == fingerprint_reference(router.numpy())
    assert int(records.fingerprints.at[0, "act:layers.0.mlp.router/input0"]) == \
        fingerprint_reference(dense_in.numpy())  # EP rank 0's replica only (the router is not a linear: as dumped)


def _tokens_per_expert(save: Path, counts: dict[int, list[list[list[int]]]]) -> Path:
    """``tokens_per_expert/rank{R}.jsonl``: for each rank, per iteration, [micro-batch][local expert] counts."""
    import json

    folder = save / "tokens_per_expert"
    folder.mkdir(parents=True, exist_ok=True)
    for rank, per_iteration in counts.items():
        lines = [json.dumps({"iter": i + 1, "block": "decoder", "layer": 1, "tpe": tpe})
                 for i, tpe in enumerate(per_iteration)]
        (folder / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return save


def test_tokens_per_expert_logs_come_in_as_the_recorders_moe_site(tmp_path: Path) -> None:
    ranks = {0: [[[5, 3], [4, 4]], [[6, 2], [1, 7]]], 1: [[[2, 6], [3, 5]], [[8, 0], [4, 4]]]}  # EP=2, 2 local
    run = open_run(import_megatron_dumps(_tokens_per_expert(tmp_path / "a", ranks), tmp_path / "ra", ep=2,
                                         progress=_quiet))
    records = run.records()
    site = "act:layers.1.mlp.tokens_per_expert"
    assert records.steps == [0, 1] and list(records.sites) == [site]
    for step in (0, 1):  # the recorder's tensor: float32 [micro-batches, experts], EP rank 1's experts after 0's
        full = np.concatenate([np.array(ranks[0][step]), np.array(ranks[1][step])], axis=1).astype(np.float32)
        assert int(records.fingerprints.at[step, site]) == fingerprint_reference(full)
    changed = {**ranks, 1: [ranks[1][0], [[8, 0], [5, 3]]]}
    other = import_megatron_dumps(_tokens_per_expert(tmp_path / "b", changed), tmp_path / "rb", ep=2, progress=_quiet)
    from workbench.analysis.compare import compare

    result = compare(records, open_run(other).records())
    assert (result.first_step, result.first_site) == (1, site)


def test_a_bad_tokens_per_expert_line_is_one_line_and_exit_2(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    save = _tokens_per_expert(tmp_path / "save", {0: [[[1, 2]]]})
    with (save / "tokens_per_expert" / "rank0.jsonl").open("a") as log:
        log.write('{"iter": 2, "block": "decoder", "layer": 1, "tpe": [[1, -2]]}\n')
    line = _one_line_exit_2(["import-megatron-dumps", str(save), "--out", str(tmp_path / "run")], capsys)
    assert "rank0.jsonl:2: not a tokens-per-expert record" in line


def test_a_tokens_per_expert_log_that_is_not_text_is_one_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    save = _tokens_per_expert(tmp_path / "save", {0: [[[1, 2]]]})
    with (save / "tokens_per_expert" / "rank0.jsonl").open("ab") as log:
        log.write(b'{"iter": 2, "block": "\xff\xfe"}\n')
    line = _one_line_exit_2(["import-megatron-dumps", str(save), "--out", str(tmp_path / "run")], capsys)
    assert "rank0.jsonl:2: not UTF-8 text" in line and not (tmp_path / "run").exists()


def test_a_dump_folder_whose_iteration_is_damaged_sizes_no_store(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    save = write_dumps(tmp_path / "save", 1, full_tensors())
    for kind in save.iterdir():  # iter_0000001 read as iter_9999999: a store of ten million steps
        if (kind / "iter_0000001").is_dir():
            (kind / "iter_0000001").rename(kind / "iter_9999999")
    line = _one_line_exit_2(["import-megatron-dumps", str(save), "--out", str(tmp_path / "run")], capsys)
    assert "last iter_N folder's: step 9,999,99" in line and "beyond" in line and not (tmp_path / "run").exists()
