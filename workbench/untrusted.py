"""Reading files the workbench did not write itself, without running code from them.

A checkpoint folder can come from anyone (``--start-from`` a colleague's run, a run copied from elsewhere),
and a pickle runs whatever it asks for while it loads. What the workbench reads from such a folder goes
through this module:

    load_torch_file(path)              torch.load(weights_only=True); a refusal names the class asked for
    load_torch_tensors(path)           the same, but an object of another class is skipped, never built
    check_dcp_metadata(folder)         a distributed checkpoint's ``.metadata`` through an allow-list
    check_megatron_checkpoint(folder)  the same, and Megatron's ``metadata.json`` and common state
    check_checkpoint_folder(folder)    every file under a folder that some loader would unpickle
    read_json_object(path, fields)     a JSON object whose fields have the types asked for
    strict_json(path)                  any JSON file: bounded in size and depth, no NaN literal, no key twice

``torch.distributed.checkpoint`` reads ``.metadata`` with a plain ``pickle.load``, and every entry that file
calls bytes with ``torch.load(weights_only=False)``. So ``check_dcp_metadata`` reads ``.metadata`` first with
an unpickler that can build only the classes such metadata is made of, and ``DcpIndex.require_tensors``
refuses a load that would read an entry as bytes. Every message is one line naming the file and what was
refused; none passes on torch's advice to turn the weights-only switch off, never right for such a file.

Imports torch inside functions only (the module is part of the torch-free foundation), so the launcher can
check a checkpoint before any rank starts.
"""

from __future__ import annotations

import _compat_pickle
import io
import json
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, BinaryIO

from workbench.errors import CheckpointError, UntrustedFileError, WorkbenchError

_TRUST = "use a checkpoint from a source you trust"
_DAMAGED = "write it again, or copy it again from its source"


# --- JSON ------------------------------------------------------------------------------------------------

_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object",
               list: "a list"}


@dataclass(frozen=True)
class JsonField:
    """One field of a JSON object read from a file."""

    kind: type
    """``int``, ``float``, ``str``, ``bool``, ``dict`` or ``list``; ``int`` and ``float`` exclude booleans."""
    required: bool = True
    minimum: float | None = None
    """The least value of a number."""

    def accepts(self, value: Any) -> bool:
        if self.kind in (int, float):
            kinds = (int,) if self.kind is int else (int, float)
            return (isinstance(value, kinds) and not isinstance(value, bool)
                    and (self.minimum is None or value >= self.minimum))  # NaN is below any minimum
        return isinstance(value, self.kind)

    def describe(self) -> str:
        kind = _KIND_NAMES[self.kind]
        return kind if self.minimum is None else f"{kind} of at least {self.minimum:g}"


COUNT = JsonField(int, minimum=0)
"""A non-negative integer: a step, a count."""


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


JSON_MAX_BYTES = 256 << 20
"""The largest JSON file the workbench reads (a golden file of a million steps of four metrics is ~100 MB)."""


class JsonRefused(ValueError):
    """Strict JSON refused a text: the reason, in words."""


def _no_constant(name: str) -> Any:
    raise JsonRefused(f"the literal {name} is not JSON (write null, or a string where a format defines one)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonRefused(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def strict_json(path: str | Path, *, max_bytes: int = JSON_MAX_BYTES) -> Any:
    """The JSON value in ``path``, strictly: at most ``max_bytes``, no NaN or Infinity literals, no key twice in
    an object, nesting within Python's recursion limit. Raises ``JsonRefused`` (a ``ValueError``) with the
    reason, ``UnicodeDecodeError``, ``json.JSONDecodeError`` or ``OSError``; callers name the file."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise JsonRefused(f"{size:,} bytes, more than the {max_bytes:,} a JSON file may hold here")
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise JsonRefused("nested deeper than any file of its format") from None


def read_json_object(path: str | Path, fields: Mapping[str, JsonField], *, others: bool = True,
                     damaged: type[WorkbenchError] = CheckpointError) -> dict[str, Any]:
    """The JSON object in ``path``, its ``fields`` checked; ``others=False`` refuses fields not named.

    A missing, truncated or ill-typed file raises ``damaged`` in one line naming the file and the field."""
    path = Path(path)
    try:
        data = strict_json(path)
    except FileNotFoundError:
        raise damaged(f"{path}: missing; {_DAMAGED}") from None
    except JsonRefused as err:
        raise damaged(f"{path}: refused: {err}; {_DAMAGED}") from None
    except json.JSONDecodeError as err:
        raise damaged(f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno}), so it is "
                      f"truncated or corrupt; {_DAMAGED}") from None
    except (OSError, UnicodeDecodeError, RecursionError) as err:
        raise damaged(f"{path}: unreadable ({_first_sentence(err)}); {_DAMAGED}") from None
    if not isinstance(data, dict):
        raise damaged(f"{path}: holds {_short(data)} where a JSON object belongs; {_DAMAGED}")
    for name, field in fields.items():
        if name not in data:
            if field.required:
                raise damaged(f"{path}: has no {name!r} field; {_DAMAGED}")
        elif not field.accepts(data[name]):
            raise damaged(f"{path}: {name!r} is {_short(data[name])}, not {field.describe()}; {_DAMAGED}")
    unknown = sorted(set(data) - set(fields))
    if not others and unknown:
        raise damaged(f"{path}: has a field {_short(unknown[0])} this reader does not know (it knows "
                      f"{', '.join(fields)}); {_DAMAGED}")
    return data


# --- torch files -----------------------------------------------------------------------------------------

_GLOBAL = re.compile(r"GLOBAL (\S+)")
_GOT = re.compile(r"but got <class '([^']+)'>")
_TORCH_ADVICE = ("Weights only load failed", "In PyTorch", "Check the documentation", "Please file an issue",
                 "(1)", "(2)", "Re-running")


def _first_sentence(err: BaseException, limit: int = 160) -> str:
    """``err``'s type and the first sentence of its message, for a one-line error."""
    text = str(err).strip()
    text = text.splitlines()[0].split(". ")[0] if text else ""
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _torch_reason(message: str) -> str:
    """The reason in a weights-only refusal, without torch's advice (which names the switch to turn off)."""
    lines = [line.strip() for line in message.split("WeightsUnpickler error:")[-1].splitlines()]
    kept = [line for line in lines if line and not line.startswith(_TORCH_ADVICE)
            and "weights_only" not in line and "safe_globals" not in line]
    return kept[0].split(". ")[0] if kept else "an instruction a file of tensors never holds"


def _refusals(err: BaseException) -> Iterable[BaseException]:
    """``err``, its causes, and the per-rank failures ``torch.distributed.checkpoint`` wraps errors in."""
    stack, seen = [err], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        failures = getattr(current, "failures", None)  # rank -> (exception, its stack summary)
        wrapped = [part for f in failures.values() for part in (f if isinstance(f, tuple) else (f,))] \
            if isinstance(failures, dict) else []
        for inner in [*wrapped, current.__cause__, current.__context__]:
            if isinstance(inner, BaseException):
                stack.append(inner)


def refusal_in(err: BaseException) -> str | None:
    """What a weights-only load refused somewhere in ``err`` (its causes included), as words for a message:
    ``"asks for posix.system, which no file of tensors needs"``; None where nothing was refused."""
    for current in _refusals(err):
        if isinstance(current, pickle.UnpicklingError):
            message = str(current)
            named = _GLOBAL.search(message) or _GOT.search(message)
            if named:
                return f"asks for {named.group(1)}, which no file of tensors needs"
            return f"is not a plain file of tensors ({_torch_reason(message)})"
    return None


def refused(path: str | Path, what: str) -> UntrustedFileError:
    """The error for a file that ``what`` (``refusal_in``'s words), naming the file and what to do."""
    return UntrustedFileError(f"{path}: refused: it {what}, so loading it could run code; {_TRUST}")


def load_torch_file(path: str | Path, *, mmap: bool = False,
                    damaged: type[WorkbenchError] = CheckpointError) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``: tensors, numbers, strings and containers.

    A file that asks for anything else raises ``UntrustedFileError`` naming the file and what it asked for; a
    missing, truncated or corrupt one raises ``damaged``. ``mmap``: map a zip-format file's tensors instead of
    reading them (for a check that only needs the pickle)."""
    import torch

    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's warnings about such a file advise the weights-only switch
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except FileNotFoundError:
        raise damaged(f"{path}: missing, so the checkpoint is incomplete; {_DAMAGED}") from None
    except pickle.UnpicklingError as err:
        what = refusal_in(err) or "is not a plain file of tensors"
        if "asks for" not in what:
            asked = _globals_in(path)
            what += f" and asks for {', '.join(asked)}" if asked else ""
        raise refused(path, what) from None
    except Exception as err:  # what torch's zip and pickle readers raise on a damaged file: EOF, zip, key errors
        raise damaged(f"{path}: truncated or corrupt ({_first_sentence(err)}); "
                      f"{_DAMAGED}") from None


def check_torch_file(path: str | Path) -> None:
    """``load_torch_file`` for its refusals only: the tensors are mapped, not read."""
    load_torch_file(path, mmap=True)


class SkippedObject:
    """What a file asked to build and ``load_torch_tensors`` did not: an empty stand-in named after the class
    the file named (``asked_for``), which was never imported."""

    asked_for = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<skipped {self.asked_for}>"


def load_torch_tensors(path: str | Path, *, damaged: type[WorkbenchError] = CheckpointError) -> tuple[Any, list[str]]:
    """``load_torch_file`` for a file that also pickles objects of its own classes (a Megatron-LM tensor dump
    keeps a module's non-tensor arguments beside its tensors): torch's weights-only unpickler builds the
    tensors and containers, and each other class the file names is read as a ``SkippedObject`` (its
    constructor, state and module are never touched). Returns the object and the classes skipped. A file
    that names the modules torch never allows (``os``, ``sys``) is still refused."""
    import torch
    from torch import _weights_only_unpickler

    path = Path(path)
    allowed = _weights_only_unpickler._get_allowed_globals()
    asked = [name for name in map(_python3_name, _pickle_globals(path)) if name not in allowed]
    stand_ins: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [
        (type(name.rpartition(".")[2] or "Skipped", (SkippedObject,), {"asked_for": name}), name) for name in asked]
    with torch.serialization.safe_globals(stand_ins):
        return load_torch_file(path, damaged=damaged), asked


def _python3_name(name: str) -> str:
    """A global as the unpickler looks it up: a protocol-2 pickle names ``__builtin__.eval`` for
    ``builtins.eval`` (``_compat_pickle``'s mapping)."""
    module, _, attribute = name.rpartition(".")
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    module, attribute = _compat_pickle.NAME_MAPPING.get((module, attribute), (module, attribute))
    return f"{module}.{attribute}"


def _globals_in(path: Path, limit: int = 64 << 20) -> list[str]:
    """The globals other than torch's that the pickle in a file names, for the message about a file torch
    refused without naming a class."""
    return [n for n in _pickle_globals(path, limit) if not n.startswith(("torch.", "collections."))][:3]


def _pickle_globals(path: Path, limit: int = 64 << 20) -> list[str]:
    """Every global the pickle in a file names, in order, read with ``pickletools`` (nothing is built or run);
    empty where it cannot be read."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
        elif path.stat().st_size <= limit:
            data = path.read_bytes()
        else:
            return []
    except Exception:  # only a message depends on it
        return []
    names: list[str] = []
    memo: dict[int, str | None] = {}
    strings: list[str] = []
    last: str | None = None  # the string the previous instruction pushed
    stream = io.BytesIO(data)
    try:
        while stream.tell() < len(data):  # a legacy torch file is several pickles in a row
            for op, arg, _ in pickletools.genops(stream):
                pushed: str | None = None
                if op.name in ("GLOBAL", "INST"):
                    names.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(arg, str) and "UNICODE" in op.name:
                    pushed = arg
                elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                    pushed = memo.get(int(arg))  # type: ignore[arg-type]
                elif op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                    memo[len(memo) if op.name == "MEMOIZE" else int(arg)] = last  # type: ignore[arg-type]
                    continue  # the stack is unchanged
                if pushed is not None:
                    strings.append(pushed)
                last = pushed
    except Exception:  # a damaged stream: keep what was read
        pass
    return list(dict.fromkeys(names))


# --- distributed checkpoints ------------------------------------------------------------------------------

_DCP = "torch.distributed.checkpoint"
_DCP_CLASSES: dict[str, frozenset[str]] = {
    # the metadata itself, each key's entry (a tensor's chunks and properties, or bytes), the checkpoint's ids;
    # TensorProperties pickles a tensor's memory format as _MEM_FORMAT_ENCODING
    f"{_DCP}.metadata": frozenset({"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                   "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
                                   "MetadataIndex", "StorageMeta"}),
    f"{_DCP}.filesystem": frozenset({"_StorageInfo"}),  # where each entry lies in the .distcp files
    # the save plans Megatron keeps in the metadata (all_local_plans)
    f"{_DCP}.planner": frozenset({"SavePlan", "WriteItem", "TensorWriteData", "WriteItemType"}),
    "torch": frozenset({"Size"}),  # shapes and offsets; dtypes are pickled as torch.<name> too (_is_dtype)
    "torch.serialization": frozenset({"_get_layout"}),  # how torch.layout pickles (copyreg)
    "pathlib": frozenset({"PosixPath"}),  # StorageMeta.checkpoint_id of a checkpoint saved under a Path
    "collections": frozenset({"OrderedDict"}),
}
"""The classes a ``.metadata`` may ask for, module by module: those torch 2.13 and Megatron Core 0.16.1
write (listed from real checkpoints of the runner and of ``torch.distributed.checkpoint.save``). Each only
holds data: building one runs no code beyond its own constructor."""

_SHARDED_OBJECT_KEY = re.compile(r".+/shard_\d+(\.\d+)*_\d+(\.\d+)*")
"""The key of a Megatron ShardedObject (``ShardedObject.unique_key``): the only entries Megatron stores as
bytes, and ones the workbench never loads (but ``_COMMON_STATE``, weights-only)."""


def _is_dtype(module: str, name: str) -> bool:
    import torch

    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the classes of ``_DCP_CLASSES``; anything else is refused before it is imported."""

    def __init__(self, file: BinaryIO, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_CLASSES.get(module, ()) or _is_dtype(module, name):
            return super().find_class(module, name)
        raise UntrustedFileError(f"{self._path}: refused: it asks for {module}.{name}, which no "
                                 f"torch.distributed.checkpoint metadata holds, so loading it could run code; "
                                 f"{_TRUST}")


@dataclass(frozen=True)
class DcpIndex:
    """What a distributed checkpoint's ``.metadata`` says it holds (``check_dcp_metadata``)."""

    path: Path
    """The ``.metadata`` file."""
    tensors: frozenset[str]
    """Keys stored as tensors, which ``torch.distributed.checkpoint`` reads with weights-only loads."""
    objects: frozenset[str]
    """Keys stored as pickled bytes, which it loads with ``torch.load(weights_only=False)``."""
    storage: Mapping[str, Any] = dataclass_field(default_factory=dict, compare=False)
    """Where each key of ``objects`` lies: its ``_StorageInfo`` (file, offset, length, transforms)."""

    def require_tensors(self, keys: Iterable[str]) -> None:
        """Refuse a load of ``keys`` that would read one as bytes, or that needs a key the checkpoint lacks."""
        wanted = sorted(set(keys))
        pickled = [k for k in wanted if k in self.objects]
        if pickled:
            raise UntrustedFileError(f"{self.path}: refused: it stores {pickled[0]!r} as pickled bytes, which "
                                     f"{_DCP} loads with an unpickler that can run code, where the model needs a "
                                     f"tensor; {_TRUST}")
        missing = [k for k in wanted if k not in self.tensors]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CheckpointError(f"{self.path.parent}: holds no tensor {missing[0]!r}{more} of this model, so it "
                                  "was written for another model; start from a checkpoint of this model")


def check_dcp_metadata(directory: str | Path) -> DcpIndex:
    """Read ``directory/.metadata`` (``torch.distributed.checkpoint``'s pickled index) building only the classes
    such metadata is made of; ``UntrustedFileError`` naming the file and any other class it asks for."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    path = Path(directory) / ".metadata"
    try:
        with path.open("rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
    except UntrustedFileError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing, so {directory} is not a complete distributed checkpoint; "
                              f"{_DAMAGED}") from None
    except Exception as err:  # a truncated or corrupt pickle, or one that builds its classes wrongly
        raise CheckpointError(f"{path}: truncated or corrupt ({_first_sentence(err)}); "
                              f"{_DAMAGED}") from None

    def refuse(what: str) -> UntrustedFileError:
        return UntrustedFileError(f"{path}: refused: {what}, so it is not what {_DCP} writes; {_TRUST}")

    if not isinstance(metadata, Metadata):
        raise refuse(f"it holds {type(metadata).__name__} where the metadata belongs")
    entries = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise refuse("its index of entries or of their storage is not a dict")
    for key, entry in entries.items():
        if not isinstance(key, str) or not isinstance(entry, (TensorStorageMetadata, BytesStorageMetadata)):
            raise refuse(f"its entry {_short(key)} is {type(entry).__name__}, neither a tensor's nor bytes")
    for index, info in storage.items():
        name = getattr(info, "relative_path", None)
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo) or not isinstance(name, str):
            raise refuse(f"its storage index holds {type(info).__name__}")
        if Path(name).name != name or name in ("", ".", ".."):
            raise refuse(f"it places an entry in {_short(name)}, outside its folder")
    objects = frozenset(k for k, e in entries.items() if isinstance(e, BytesStorageMetadata))
    return DcpIndex(path=path, tensors=frozenset(k for k, e in entries.items() if isinstance(e, TensorStorageMetadata)),
                    objects=objects, storage={i.fqn: s for i, s in storage.items() if i.fqn in objects})


_COMMON_STATE = "common_state/shard_0_1"
"""The ShardedObject in which megatron-core 0.19+ saves the checkpoint's common state instead of ``common.pt``;
its load reads it through ``torch.distributed.checkpoint``, that is with ``torch.load(weights_only=False)``."""


def _load_dcp_bytes(index: DcpIndex, key: str) -> Any:
    """The entry ``key`` that ``index`` stores as bytes, read from its file and loaded weights-only."""
    import torch

    info: Any = index.storage.get(key)
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0):
        raise CheckpointError(f"{index.path}: gives no place for {key!r}; {_DAMAGED}")
    if getattr(info, "transform_descriptors", None):  # compressed or otherwise encoded: not what Megatron writes
        raise CheckpointError(f"{index.path}: stores {key!r} transformed; the workbench reads only plain entries")
    path = index.path.parent / info.relative_path
    try:
        with path.open("rb") as f:
            f.seek(offset)
            raw = f.read(length)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing, so the checkpoint is incomplete; {_DAMAGED}") from None
    if len(raw) != length:
        raise CheckpointError(f"{path}: truncated (it ends inside {key!r}); {_DAMAGED}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's warnings advise the weights-only switch
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise refused(f"{path} ({key!r})", refusal_in(err) or "is not a plain file of tensors") from None
    except Exception as err:
        raise CheckpointError(f"{path}: {key!r} is truncated or corrupt ({_first_sentence(err)}); "
                              f"{_DAMAGED}") from None


_MEGATRON_CONFIG = {"sharded_backend": JsonField(str), "sharded_backend_version": JsonField(int, required=False),
                    "common_backend": JsonField(str, required=False),
                    "common_backend_version": JsonField(int, required=False)}
"""Megatron's ``metadata.json`` (``CheckpointingConfig``): it takes no other field."""


def check_megatron_checkpoint(directory: str | Path) -> DcpIndex:
    """Check a Megatron Core distributed checkpoint (torch_dist) before ``dist_checkpointing.load`` reads it:
    ``metadata.json`` as JSON naming the torch_dist format, ``.metadata`` through ``check_dcp_metadata``, bytes
    only for Megatron's ShardedObjects, and the common state weights-only (Megatron loads it without saying
    ``weights_only``): ``common.pt`` (megatron-core up to 0.18), else the ``common_state`` entry (0.19+)."""
    directory = Path(directory)
    config = read_json_object(directory / "metadata.json", _MEGATRON_CONFIG, others=False)
    backend = (config["sharded_backend"], config.get("sharded_backend_version", 1),
               config.get("common_backend", "torch"), config.get("common_backend_version", 1))
    if backend != ("torch_dist", 1, "torch", 1):
        raise CheckpointError(f"{directory / 'metadata.json'}: a Megatron checkpoint in the format {backend}; "
                              "the workbench reads only ('torch_dist', 1, 'torch', 1), the format it writes")
    index = check_dcp_metadata(directory)
    stray = sorted(k for k in index.objects if not _SHARDED_OBJECT_KEY.fullmatch(k))
    if stray:
        raise UntrustedFileError(f"{index.path}: refused: it stores {stray[0]!r} as pickled bytes, which {_DCP} "
                                 "loads with an unpickler that can run code, and Megatron stores only its "
                                 f"ShardedObjects (KEY/shard_OFFSET_SHAPE) so; {_TRUST}")
    legacy = directory / "common.pt"
    if legacy.exists() or _COMMON_STATE not in index.objects:
        common = load_torch_file(legacy)
        if not isinstance(common, dict):
            raise CheckpointError(f"{legacy}: holds {type(common).__name__} where Megatron keeps a dict; {_DAMAGED}")
    if _COMMON_STATE in index.objects:
        state = _load_dcp_bytes(index, _COMMON_STATE)
        if not (isinstance(state, list) and len(state) == 1 and isinstance(state[0], dict)):
            raise CheckpointError(f"{index.path.parent}: its {_COMMON_STATE!r} holds {type(state).__name__} where "
                                  f"Megatron keeps a list of one dict; {_DAMAGED}")
    return index


def check_checkpoint_folder(directory: str | Path) -> None:
    """Check every file under ``directory`` that a loader would unpickle, without running code from any: each
    torch file (``*.pt``) weights-only, each folder with Megatron's ``metadata.json`` through
    ``check_megatron_checkpoint``, each other one with a ``.metadata`` through ``check_dcp_metadata``."""
    directory = Path(directory)
    megatron = {p.parent for p in directory.rglob("metadata.json")}
    for file in sorted(directory.rglob("*.pt")):
        if not (file.name == "common.pt" and file.parent in megatron):  # checked with its checkpoint below
            check_torch_file(file)
    for folder in sorted(megatron):
        check_megatron_checkpoint(folder)
    for folder in sorted({p.parent for p in directory.rglob(".metadata")} - megatron):
        check_dcp_metadata(folder)
