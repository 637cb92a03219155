"""Files the workbench did not write load without running code from them, or are refused in one line.

Every poisoned file here carries a payload that, unpickled, creates a marker file: each test checks that the
marker was not created, that the error names the file and what it asked for, and that it never repeats
torch's advice to load with the weights-only switch off.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from workbench.config import RunConfig
from workbench.errors import CheckpointError, UntrustedFileError
from workbench.store.synthetic import write_synthetic_run
from workbench.untrusted import (
    COUNT,
    JsonField,
    check_checkpoint_folder,
    check_dcp_metadata,
    check_megatron_checkpoint,
    load_torch_file,
    read_json_object,
)

EXTRA_STATE = "decoder.layers.mlp.linear_fc1._extra_state/shard_0_1"
"""A Megatron ShardedObject's key: the one kind of entry Megatron stores as pickled bytes."""
MEGATRON_CONFIG = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                   "common_backend_version": 1}


class Payload:
    """What a poisoned file runs when unpickled: it creates ``marker`` (pickled as a call of ``io.open``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def torch_bytes(obj: Any) -> bytes:
    """``obj`` as ``torch.save`` writes it."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "payload-ran"
    yield path
    assert not path.exists(), "a payload ran"


def assert_one_line(err: pytest.ExceptionInfo[Exception], path: Path, *words: str) -> None:
    message = str(err.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    assert "weights_only" not in message and "safe_globals" not in message, message
    for word in words:
        assert word in message, message


def model_state(step: int = 1) -> dict[str, Any]:
    """A model file of a one-parameter workbench checkpoint, as the runner writes it."""
    w = torch.arange(6.0).reshape(2, 3)
    return {"step": step, "params": {"w": w}, "shards": {"w": None},
            "optimizer": {"format": "megatron-by-name", "masters": {"w": w.clone()}, "scalers": [],
                          "moments": {"w": {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2, 3),
                                            "exp_avg_sq": torch.zeros(2, 3)}}},
            "scheduler": {"num_steps": step}}


def write_checkpoint(directory: Path, step: int = 1) -> Path:
    """A complete workbench checkpoint folder of one TP x PP rank, without a Megatron folder."""
    directory.mkdir(parents=True)
    torch.save(model_state(step), directory / "model_tp0_pp0.pt")
    torch.save({"rng": torch.get_rng_state()}, directory / "rank0.pt")
    (directory / "meta.json").write_text(json.dumps({"step": step, "layout": {"tp": 1}, "config_hash": "x"}))
    return directory


def write_megatron_folder(directory: Path, extra_state: Any = None) -> Path:
    """A Megatron distributed checkpoint (torch_dist) of one tensor ``w`` and one ShardedObject holding
    ``extra_state``, saved in one process through torch.distributed.checkpoint as Megatron lays it out (an
    object entry is ``torch.save([data])``)."""
    dcp.save({"w": torch.arange(6.0).reshape(2, 3), EXTRA_STATE: [extra_state]}, checkpoint_id=str(directory),
             no_dist=True)
    (directory / "metadata.json").write_text(json.dumps(MEGATRON_CONFIG))
    torch.save({}, directory / "common.pt")
    return directory


def read_metadata(directory: Path) -> Any:
    with (directory / ".metadata").open("rb") as f:
        return pickle.load(f)  # our own file, just written by dcp.save


def store_as_bytes(directory: Path, key: str, blob: bytes) -> None:
    """Rewrite a DCP folder's metadata so that ``key`` is stored as pickled bytes holding ``blob``."""
    metadata = read_metadata(directory)
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    (directory / "poison.distcp").write_bytes(blob)
    metadata.state_dict_metadata[key] = BytesStorageMetadata()
    metadata.storage_data = {i: s for i, s in metadata.storage_data.items() if i.fqn != key}
    metadata.storage_data[MetadataIndex(key)] = _StorageInfo("poison.distcp", 0, len(blob))
    with (directory / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)


# --- torch files ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["torch zip", "raw pickle v2", "raw pickle v4"])
def test_a_poisoned_torch_file_is_refused_naming_the_file_and_the_class(tmp_path: Path, marker: Path,
                                                                        form: str) -> None:
    path = tmp_path / "model.pt"
    if form == "torch zip":
        torch.save({"params": {"w": Payload(marker)}}, path)
    else:
        path.write_bytes(pickle.dumps({"w": Payload(marker)}, protocol=2 if form.endswith("v2") else 4))
    with pytest.raises(UntrustedFileError) as err:
        load_torch_file(path)
    assert_one_line(err, path, "refused", "io.open")


def test_a_plain_file_of_tensors_loads(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(model_state(), path)
    state = load_torch_file(path)
    assert torch.equal(state["params"]["w"], model_state()["params"]["w"])


@pytest.mark.parametrize("damage", ["half", "empty", "text"])
def test_a_damaged_torch_file_is_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "model.pt"
    torch.save(model_state(), path)
    data = path.read_bytes()
    path.write_bytes({"half": data[: len(data) // 2], "empty": b"", "text": b"hello\n"}[damage])
    with pytest.raises(CheckpointError) as err:
        load_torch_file(path)
    assert_one_line(err, path, "truncated or corrupt")


@pytest.mark.parametrize("optimizer, words", [
    ({"names": ["w"], "masters": {"w": torch.zeros(2, 3)}, "param_groups": [], "scaler": None,
      "adam_state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2, 3), "exp_avg_sq": torch.zeros(2, 3)}}},
     ("former CPU optimizer", "train the run again")),
    ({"state": {0: {"exp_avg": torch.zeros(2, 3)}}, "param_groups": [{"params": [0]}]},
     ("no optimizer state by parameter name", "train the run again"))], ids=["former-cpu-adamw", "by-group-index"])
def test_a_checkpoint_of_another_optimizer_state_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, optimizer: dict[str, Any], words: tuple[str, ...]) -> None:
    """Checkpoints that the workbench wrote before its runs trained with Megatron's optimizer (its own AdamW's
    state by index), or any other optimizer's state, are never loaded into Megatron's optimizer."""
    from workbench.runner import checkpoint
    from workbench.store.layout import RunPaths

    paths = RunPaths(tmp_path / "run")
    directory = write_checkpoint(paths.checkpoint(1))
    torch.save({**model_state(), "optimizer": optimizer}, directory / "model_tp0_pp0.pt")
    monkeypatch.setattr(checkpoint, "_model_file", lambda d: d / "model_tp0_pp0.pt")  # no parallel state here
    monkeypatch.setattr(checkpoint.dist, "get_rank", lambda: 0)
    for load in (checkpoint.load_full_state, lambda d: checkpoint.load(paths, 1)):
        with pytest.raises(CheckpointError) as err:
            load(directory)
        assert_one_line(err, directory / "model_tp0_pp0.pt", *words)


def test_every_checkpoint_loader_refuses_a_poisoned_model_file(tmp_path: Path, marker: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.runner import checkpoint
    from workbench.store.layout import RunPaths

    paths = RunPaths(tmp_path / "run")
    directory = write_checkpoint(paths.checkpoint(1))
    good = checkpoint.load_full_state(directory)
    assert torch.equal(good["params"]["w"], model_state()["params"]["w"])
    assert sorted(good["optimizer_named"]["w"]) == ["exp_avg", "exp_avg_sq", "master", "step"]
    monkeypatch.setattr(checkpoint, "_model_file", lambda d: d / "model_tp0_pp0.pt")  # no parallel state here
    monkeypatch.setattr(checkpoint.dist, "get_rank", lambda: 0)
    assert torch.equal(checkpoint.load(paths, 1)["params"]["w"], model_state()["params"]["w"])

    torch.save({**model_state(), "params": {"w": Payload(marker)}}, directory / "model_tp0_pp0.pt")
    for load in (checkpoint.load_full_params, checkpoint.load_full_state, lambda d: checkpoint.load(paths, 1)):
        with pytest.raises(UntrustedFileError) as err:
            load(directory)
        assert_one_line(err, directory / "model_tp0_pp0.pt", "io.open")
    torch.save(model_state(), directory / "model_tp0_pp0.pt")
    torch.save({"rng": Payload(marker)}, directory / "rank0.pt")
    with pytest.raises(UntrustedFileError) as err:
        checkpoint.load(paths, 1)
    assert_one_line(err, directory / "rank0.pt", "io.open")


def test_a_truncated_model_file_of_a_checkpoint_is_one_line(tmp_path: Path) -> None:
    from workbench.runner.checkpoint import load_full_params

    directory = write_checkpoint(tmp_path / "step_000001")
    model = directory / "model_tp0_pp0.pt"
    model.write_bytes(model.read_bytes()[:-40])
    with pytest.raises(CheckpointError) as err:
        load_full_params(directory)
    assert_one_line(err, model, "truncated or corrupt")


def test_a_torch_file_of_something_else_than_a_model_file_is_one_line(tmp_path: Path) -> None:
    from workbench.runner.checkpoint import load_full_params

    directory = write_checkpoint(tmp_path / "step_000001")
    torch.save([1, 2], directory / "model_tp0_pp0.pt")
    with pytest.raises(CheckpointError) as err:
        load_full_params(directory)
    assert_one_line(err, directory / "model_tp0_pp0.pt", "'params'")


# --- meta.json -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, field", [
    ('{"step": 3, "lay', "not valid JSON"), ('{"step": "abc"}', "'step'"), ('{"step": -1}', "'step'"),
    ('{"step": true}', "'step'"), ('{"layout": {}}', "'step'"), ('[3]', "JSON object"),
    ('{"step": 3, "layout": "tp2"}', "'layout'")])
def test_a_damaged_meta_json_is_one_line_naming_the_file_and_the_field(tmp_path: Path, text: str,
                                                                       field: str) -> None:
    from workbench.runner.checkpoint import read_meta_at

    (tmp_path / "meta.json").write_text(text)
    with pytest.raises(CheckpointError) as err:
        read_meta_at(tmp_path)
    assert_one_line(err, tmp_path / "meta.json", field)


def test_json_fields_are_checked_by_type(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"step": 2, "rate": 0.5, "extra": 1}')
    assert read_json_object(path, {"step": COUNT, "rate": JsonField(float, minimum=0)})["step"] == 2
    with pytest.raises(CheckpointError, match="'extra'"):
        read_json_object(path, {"step": COUNT, "rate": JsonField(float)}, others=False)
    path.write_text('{"step": 2, "rate": NaN}')  # not JSON: refused before its fields are looked at
    with pytest.raises(CheckpointError, match="the literal NaN is not JSON"):
        read_json_object(path, {"rate": JsonField(float, minimum=0)})


# --- distributed checkpoints -----------------------------------------------------------------------------------

@pytest.fixture
def megatron_folder(tmp_path: Path) -> Path:
    return write_megatron_folder(tmp_path / "step_000001" / "megatron")


def test_a_real_distributed_checkpoint_passes(megatron_folder: Path) -> None:
    index = check_megatron_checkpoint(megatron_folder)
    assert index.tensors == {"w"} and index.objects == {EXTRA_STATE}
    index.require_tensors(["w"])
    assert check_dcp_metadata(megatron_folder) == index


@pytest.mark.parametrize("where", ["whole file", "inside the metadata"])
def test_a_poisoned_dcp_metadata_is_refused_naming_the_file_and_the_class(megatron_folder: Path, marker: Path,
                                                                          where: str) -> None:
    metadata = read_metadata(megatron_folder)
    if where == "inside the metadata":  # behind classes the allow-list admits
        metadata.state_dict_metadata["w"] = Payload(marker)
    with (megatron_folder / ".metadata").open("wb") as f:
        pickle.dump(metadata if where != "whole file" else Payload(marker), f)
    for check in (check_dcp_metadata, check_megatron_checkpoint, check_checkpoint_folder):
        with pytest.raises(UntrustedFileError) as err:
            check(megatron_folder)
        assert_one_line(err, megatron_folder / ".metadata", "refused", "io.open")


def test_a_tensor_stored_as_bytes_is_a_real_attack_on_torch_distributed_checkpoint(megatron_folder: Path,
                                                                                    tmp_path: Path) -> None:
    """The fixture of the next test: a plain ``dcp.load`` of the model's tensor runs the payload."""
    ran = tmp_path / "plain-dcp-ran"
    store_as_bytes(megatron_folder, "w", torch_bytes(Payload(ran)))
    dcp.load({"w": torch.zeros(2, 3)}, checkpoint_id=str(megatron_folder), no_dist=True)
    assert ran.exists()


def test_a_tensor_stored_as_bytes_is_refused(megatron_folder: Path, marker: Path) -> None:
    store_as_bytes(megatron_folder, "w", torch_bytes(Payload(marker)))
    index = check_dcp_metadata(megatron_folder)  # only allowed classes: the metadata itself passes
    assert "w" in index.objects
    with pytest.raises(UntrustedFileError) as err:
        index.require_tensors(["w"])
    assert_one_line(err, megatron_folder / ".metadata", "'w'", "pickled bytes")
    with pytest.raises(UntrustedFileError) as err:  # Megatron stores only ShardedObjects as bytes
        check_megatron_checkpoint(megatron_folder)
    assert_one_line(err, megatron_folder / ".metadata", "'w'", "ShardedObjects")


def test_a_distributed_checkpoint_without_a_requested_tensor_is_one_line(megatron_folder: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        check_dcp_metadata(megatron_folder).require_tensors(["w", "v"])
    assert_one_line(err, megatron_folder, "'v'", "another model")


def test_megatron_s_other_files_are_checked(megatron_folder: Path, marker: Path) -> None:
    torch.save({"args": Payload(marker)}, megatron_folder / "common.pt")  # Megatron loads it without weights_only
    with pytest.raises(UntrustedFileError) as err:
        check_megatron_checkpoint(megatron_folder)
    assert_one_line(err, megatron_folder / "common.pt", "io.open")
    torch.save({}, megatron_folder / "common.pt")
    (megatron_folder / "metadata.json").write_text(json.dumps({**MEGATRON_CONFIG, "sharded_backend": "zarr"}))
    with pytest.raises(CheckpointError) as err:
        check_megatron_checkpoint(megatron_folder)
    assert_one_line(err, megatron_folder / "metadata.json", "zarr")
    (megatron_folder / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded')
    with pytest.raises(CheckpointError) as err:
        check_megatron_checkpoint(megatron_folder)
    assert_one_line(err, megatron_folder / "metadata.json", "not valid JSON")


def test_the_common_state_inside_the_checkpoint_is_checked(megatron_folder: Path, marker: Path) -> None:
    """megatron-core 0.19+ writes no ``common.pt``: the common state is the ShardedObject ``common_state``,
    which its load reads through torch.distributed.checkpoint (weights_only=False)."""
    (megatron_folder / "common.pt").unlink()
    with pytest.raises(CheckpointError) as err:
        check_megatron_checkpoint(megatron_folder)
    assert_one_line(err, megatron_folder / "common.pt", "missing")
    store_as_bytes(megatron_folder, "common_state/shard_0_1", torch_bytes([{}]))
    assert "common_state/shard_0_1" in check_megatron_checkpoint(megatron_folder).objects
    store_as_bytes(megatron_folder, "common_state/shard_0_1", torch_bytes([{"args": Payload(marker)}]))
    for check in (check_megatron_checkpoint, check_checkpoint_folder):
        with pytest.raises(UntrustedFileError) as err:
            check(megatron_folder)
        assert_one_line(err, megatron_folder / "poison.distcp", "'common_state/shard_0_1'", "io.open")
    store_as_bytes(megatron_folder, "common_state/shard_0_1", torch_bytes({}))
    with pytest.raises(CheckpointError) as err:
        check_megatron_checkpoint(megatron_folder)
    assert_one_line(err, megatron_folder, "list of one dict")


def test_a_truncated_dcp_metadata_is_one_line(megatron_folder: Path) -> None:
    path = megatron_folder / ".metadata"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError) as err:
        check_dcp_metadata(megatron_folder)
    assert_one_line(err, path, "truncated or corrupt")


def test_a_storage_entry_outside_its_folder_is_refused(megatron_folder: Path) -> None:
    metadata = read_metadata(megatron_folder)
    for info in metadata.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    with (megatron_folder / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)
    with pytest.raises(UntrustedFileError) as err:
        check_dcp_metadata(megatron_folder)
    assert_one_line(err, megatron_folder / ".metadata", "outside its folder")


def test_a_whole_checkpoint_folder_is_checked(tmp_path: Path, marker: Path) -> None:
    directory = write_checkpoint(tmp_path / "step_000001")
    write_megatron_folder(directory / "megatron")
    check_checkpoint_folder(directory)
    torch.save({"rng": Payload(marker)}, directory / "rank0.pt")
    with pytest.raises(UntrustedFileError) as err:
        check_checkpoint_folder(directory)
    assert_one_line(err, directory / "rank0.pt", "io.open")


# --- load_megatron: checked first, then only tensors are asked of Megatron ---------------------------------------

@pytest.fixture
def one_process_group() -> Iterator[None]:
    """A gloo process group of this process alone, as Megatron's loader needs one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    yield
    dist.destroy_process_group()


class OneTensorModel(torch.nn.Module):
    """A model chunk whose sharded state is the tensor ``w`` and a ShardedObject, as a Megatron layer's."""

    def __init__(self, object_key: str = EXTRA_STATE.split("/")[0]) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2, 3))
        self.object_key = object_key

    def sharded_state_dict(self) -> dict[str, Any]:
        from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

        return {"w": ShardedTensor.from_rank_offsets("w", self.w.detach(), replica_id=0),
                "_extra_state": ShardedObject(self.object_key, None, (1,), (0,), replica_id=0)}


class TensorAtObjectKeyModel(OneTensorModel):
    """A model chunk that asks for a tensor under the key of the checkpoint's ShardedObject."""

    def sharded_state_dict(self) -> dict[str, Any]:
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        return {"w": ShardedTensor.from_rank_offsets(EXTRA_STATE, self.w.detach(), replica_id=0)}


def test_load_megatron_refuses_a_poisoned_metadata_before_megatron_reads_it(megatron_folder: Path,
                                                                             marker: Path) -> None:
    from workbench.runner.checkpoint import load_megatron

    with (megatron_folder / ".metadata").open("wb") as f:
        pickle.dump(Payload(marker), f)
    with pytest.raises(UntrustedFileError) as err:
        load_megatron(megatron_folder.parent, [OneTensorModel()])  # refused before any process group is needed
    assert_one_line(err, megatron_folder / ".metadata", "io.open")


def test_load_megatron_loads_the_tensors_and_never_the_pickled_bytes(tmp_path: Path, marker: Path,
                                                                      one_process_group: None) -> None:
    from workbench.runner.checkpoint import load_megatron

    folder = write_megatron_folder(tmp_path / "step_000001" / "megatron", extra_state=Payload(marker))
    model = OneTensorModel()
    load_megatron(folder.parent, [model])
    assert torch.equal(model.w.detach(), torch.arange(6.0).reshape(2, 3))


def test_load_megatron_refuses_to_read_bytes_as_a_model_tensor(tmp_path: Path, marker: Path,
                                                               one_process_group: None) -> None:
    from workbench.runner.checkpoint import load_megatron

    folder = write_megatron_folder(tmp_path / "step_000001" / "megatron")
    store_as_bytes(folder, EXTRA_STATE, torch_bytes(Payload(marker)))  # a ShardedObject's key: the folder check passes
    with pytest.raises(UntrustedFileError) as err:
        load_megatron(folder.parent, [TensorAtObjectKeyModel()])
    assert_one_line(err, folder / ".metadata", EXTRA_STATE, "pickled bytes")


def test_load_megatron_refuses_a_tensor_entry_that_asks_for_a_class(tmp_path: Path, marker: Path,
                                                                    one_process_group: None) -> None:
    from workbench.runner.checkpoint import load_megatron

    folder = write_megatron_folder(tmp_path / "step_000001" / "megatron")
    metadata = read_metadata(folder)
    info = next(s for i, s in metadata.storage_data.items() if i.fqn == "w")
    shard = folder / info.relative_path
    blob = torch_bytes(Payload(marker))
    data = shard.read_bytes()
    info.offset, info.length = len(data), len(blob)
    shard.write_bytes(data + blob)
    with (folder / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)
    with pytest.raises(UntrustedFileError) as err:
        load_megatron(folder.parent, [OneTensorModel()])
    assert_one_line(err, folder, "io.open")


# --- the launcher: refused before any rank starts -------------------------------------------------------------

@pytest.fixture
def source_run(tmp_path: Path) -> Path:
    """A run store (no training) with one checkpoint at step 2."""
    run = write_synthetic_run(tmp_path / "source")
    write_checkpoint(run / "checkpoints" / "step_000002", step=2)
    return run


def test_start_from_refuses_a_poisoned_checkpoint_before_any_rank_starts(source_run: Path, marker: Path) -> None:
    from workbench.runner.launch import start_checkpoint

    cfg = RunConfig(name="other", steps=12)
    directory = source_run / "checkpoints" / "step_000002"
    assert start_checkpoint(directory, cfg)[1]["step"] == 2
    torch.save({**model_state(), "params": {"w": Payload(marker)}}, directory / "model_tp0_pp0.pt")
    with pytest.raises(UntrustedFileError) as err:
        start_checkpoint(directory, cfg)
    assert_one_line(err, directory / "model_tp0_pp0.pt", "io.open")
    torch.save(model_state(), directory / "model_tp0_pp0.pt")
    write_megatron_folder(directory / "megatron")
    with (directory / "megatron" / ".metadata").open("wb") as f:
        pickle.dump(Payload(marker), f)
    with pytest.raises(UntrustedFileError) as err:
        start_checkpoint(source_run, cfg)  # a run folder: its latest checkpoint
    assert_one_line(err, directory / "megatron" / ".metadata", "io.open")
    shutil.rmtree(directory / "megatron")
    (directory / "meta.json").write_text('{"step": "abc"}')
    with pytest.raises(CheckpointError) as err:
        start_checkpoint(directory, cfg)
    assert_one_line(err, directory / "meta.json", "'step'")


def test_workbench_run_start_from_a_poisoned_checkpoint_exits_2_with_one_line(
        source_run: Path, marker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    directory = source_run / "checkpoints" / "step_000002"
    write_megatron_folder(directory / "megatron")
    with (directory / "megatron" / ".metadata").open("wb") as f:
        pickle.dump(Payload(marker), f)
    config = tmp_path / "other.toml"
    config.write_text('name = "other"\nsteps = 12\n')
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(tmp_path / "runs"), "--start-from", str(directory)]) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("workbench:")]
    assert len(error) == 1 and error[0].startswith("workbench: error: "), error
    assert str(directory / "megatron" / ".metadata") in error[0] and "io.open" in error[0]
    assert "weights_only" not in error[0]
    assert not (tmp_path / "runs" / "other").exists()  # refused before the run's store was made


# --- a real run: Megatron's checkpoint of the runner, started from at another layout ------------------------------

def toml_of(data: dict[str, Any]) -> str:
    """A run config as TOML (scalars, lists and one level of tables)."""
    def value(v: Any) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for table, fields in ((k, v) for k, v in data.items() if isinstance(v, dict)):
        lines += [f"[{table}]", *(f"{k} = {value(v)}" for k, v in fields.items())]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real TP=1 run of the integration tests' tiny config, 2 steps, checkpoints in Megatron's format."""
    from tests.helpers.training import tiny_config
    from workbench.runner.launch import launch

    return launch(tiny_config("source", steps=2, checkpoint_format="megatron"),
                  tmp_path_factory.mktemp("megatron-run") / "source")


@pytest.fixture
def real_checkpoint(megatron_run: Path, tmp_path: Path) -> Path:
    """A copy of the real run (to poison), and its checkpoint at step 1."""
    copy = shutil.copytree(megatron_run, tmp_path / "source")
    return copy / "checkpoints" / "step_000001"


@pytest.mark.integration
@pytest.mark.parametrize("poison", ["a payload as .metadata", "a model tensor stored as bytes"])
def test_workbench_run_start_from_a_poisoned_real_checkpoint_exits_2_with_one_line(
        real_checkpoint: Path, marker: Path, tmp_path: Path, poison: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.training import TINY
    from workbench.cli import main

    folder = real_checkpoint / "megatron"
    check_checkpoint_folder(real_checkpoint)  # the runner's own checkpoint passes
    if poison == "a payload as .metadata":
        with (folder / ".metadata").open("wb") as f:
            pickle.dump(Payload(marker), f)
    else:
        store_as_bytes(folder, "embedding.word_embeddings.weight", torch_bytes(Payload(marker)))
    config = tmp_path / "started.toml"
    config.write_text(toml_of({**TINY, "name": "started", "steps": 2}))
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(tmp_path / "runs"), "--start-from", str(real_checkpoint)]) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("workbench:")]
    assert len(error) == 1 and error[0].startswith("workbench: error: "), error
    assert str(folder / ".metadata") in error[0] and "weights_only" not in error[0]
    assert ("io.open" if poison.startswith("a payload") else "embedding.word_embeddings.weight") in error[0]


@pytest.mark.integration
def test_a_rank_refuses_a_poisoned_real_checkpoint_in_one_line(real_checkpoint: Path, marker: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the launcher's check (switched off here), the rank's own check refuses the file."""
    from tests.helpers.training import tiny_config
    from workbench import untrusted
    from workbench.errors import LaunchError
    from workbench.runner.launch import launch

    with (real_checkpoint / "megatron" / ".metadata").open("wb") as f:
        pickle.dump(Payload(marker), f)
    monkeypatch.setattr(untrusted, "check_checkpoint_folder", lambda directory: None)
    with pytest.raises(LaunchError) as err:
        launch(tiny_config("started", steps=2), tmp_path / "started", start_from=real_checkpoint)
    message = str(err.value)
    refusal = [line for line in message.splitlines() if line.startswith("workbench: error: ")]
    assert len(refusal) == 1 and str(real_checkpoint / "megatron" / ".metadata") in refusal[0], message
    assert "io.open" in refusal[0] and "weights_only" not in message and "Traceback" not in message, message


@pytest.mark.integration
def test_a_poisoned_extra_state_of_a_real_checkpoint_is_never_loaded(real_checkpoint: Path, marker: Path,
                                                                    tmp_path: Path) -> None:
    """Megatron stores the layers' ``_extra_state`` as pickled bytes: a start leaves them unread."""
    from tests.helpers.training import tiny_config
    from workbench.runner.launch import launch
    from workbench.store.reader import open_run

    folder = real_checkpoint / "megatron"
    # megatron-core 0.19+ also stores its common state so (test_the_common_state_inside_the_checkpoint_is_checked)
    extra = sorted(check_dcp_metadata(folder).objects - {"common_state/shard_0_1"})
    assert extra and all("_extra_state/shard_" in key for key in extra)
    for key in extra:
        store_as_bytes(folder, key, torch_bytes([Payload(marker)]))
    started = launch(tiny_config("started", steps=2), tmp_path / "started", start_from=real_checkpoint)
    assert open_run(started).status == "complete"


def _poison_model_file(checkpoint: Path, marker: Path) -> None:
    (checkpoint / "model_tp0_pp0.pt").write_bytes(torch_bytes({"params": Payload(marker)}))


def _truncate_model_file(checkpoint: Path, marker: Path) -> None:
    path = checkpoint / "model_tp0_pp0.pt"
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.integration
@pytest.mark.parametrize("damage", [_poison_model_file, _truncate_model_file], ids=["poisoned", "truncated"])
@pytest.mark.parametrize("verb", ["run --resume", "replay"])
def test_resume_and_replay_refuse_a_bad_model_file_before_any_rank_starts(
        megatron_run: Path, marker: Path, tmp_path: Path, damage: Any, verb: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.training import TINY
    from workbench.cli import main

    run = shutil.copytree(megatron_run, tmp_path / "source")
    latest = run / "checkpoints" / "step_000002"
    damage(run / "checkpoints" / "step_000001", marker)
    damage(latest, marker)
    config = tmp_path / "source.toml"
    config.write_text(toml_of({**TINY, "name": "source", "steps": 2, "checkpoint_format": "megatron"}))
    args = ["run", str(config), "--out", str(tmp_path), "--resume"] if verb == "run --resume" else \
        ["replay", str(run), "--step", "1", "--out", str(tmp_path / "replay")]
    log = (run / "logs" / "rank0.log").read_text()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("workbench:")]
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), err
    assert "model_tp0_pp0.pt" in lines[0] and "weights_only" not in err and "Traceback" not in err
    assert (run / "logs" / "rank0.log").read_text() == log  # no rank started
    assert not (tmp_path / "replay").exists()


class _Evaluates:
    """A pickle that calls ``eval`` while it loads (a builtin, which torch does not block by module)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, ("open('/tmp/workbench-eval-was-run', 'w')",))


def test_load_torch_tensors_reads_the_tensors_and_skips_every_other_object_unbuilt(tmp_path: Path) -> None:
    from workbench.untrusted import SkippedObject, load_torch_tensors

    marker = Path("/tmp/workbench-eval-was-run")
    marker.unlink(missing_ok=True)
    path = tmp_path / "dump.pth"
    torch.save({"x": torch.arange(3.0), "call": _Evaluates(), "n": 2}, path)
    content, skipped = load_torch_tensors(path)
    assert torch.equal(content["x"], torch.arange(3.0)) and content["n"] == 2
    assert isinstance(content["call"], SkippedObject) and content["call"].asked_for == "builtins.eval"
    assert skipped == ["builtins.eval"] and not marker.exists()
    with pytest.raises(UntrustedFileError, match="asks for eval"):
        load_torch_file(path)  # the all-or-nothing loader still refuses the file
