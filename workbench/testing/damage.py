"""Damage to a run store's files and to the files other programs write: the mutators the fuzz tests draw from
(hypothesis strategies of damage as data, and the functions that apply it), and the run-store contract's
damage cases (``workbench.testing.run_store``).

    damage(store, mutation, elsewhere)     # one of ``mutations()``: a file of ``store`` damaged; what, in words
    damage_file(path, mutation)            # one of ``file_mutations()``: a log, an event file, a dump
    damage_bytes(path, {"action": "truncate", "keep": 0.5})

Needs hypothesis (the ``test`` extra) for the strategies.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
"""What a damaged ``zarr.json`` may hold where a value was: any JSON, huge and negative numbers included."""


@st.composite
def mutations(draw: st.DrawFn) -> dict[str, Any]:
    """One damage to one file of a store, as data (``damage`` applies it): which file (an index into its sorted
    files), and what: a JSON value replaced or removed, the file cut, bytes flipped, garbage, the file removed,
    or replaced by a link to the same file of another store."""
    action = draw(st.sampled_from(["json", "json", "json", "truncate", "flip", "garbage", "remove", "link"]))
    mutation: dict[str, Any] = {"file": draw(st.integers(0, 10_000)), "action": action}
    if action == "json":
        mutation.update(path=draw(st.lists(st.integers(0, 50), min_size=1, max_size=6)),
                        value=draw(JSON_VALUES), delete=draw(st.booleans()))
    elif action == "truncate":
        mutation.update(keep=draw(st.floats(0, 1)))
    elif action == "flip":
        mutation.update(at=draw(st.lists(st.floats(0, 1), min_size=1, max_size=8)))
    elif action == "garbage":
        mutation.update(data=draw(st.binary(max_size=256)))
    return mutation


def damage(store: Path, mutation: dict[str, Any], elsewhere: Path) -> str:
    """Apply ``mutation`` to a file of ``store`` (a link points at the same file under ``elsewhere``); what was
    done, in words."""
    files = sorted(p for p in store.rglob("*") if p.is_file() and not p.is_symlink())
    path = files[mutation["file"] % len(files)]
    action = mutation["action"]
    relative = path.relative_to(store).as_posix()
    if action == "json" and path.name.endswith(".json"):
        try:
            document = json.loads(path.read_text())
        except ValueError:
            document = None
        if document is not None:
            where = _replace(document, mutation["path"], mutation["value"], mutation["delete"])
            path.write_text(json.dumps(document))
            return f"{relative}: {where}"
        action = "flip"
    if action in ("flip", "truncate", "garbage"):  # a JSON damage of a file that is no JSON: flipped bytes
        return f"{relative}: {damage_bytes(path, {'at': [0.5], **mutation, 'action': action})}"
    if action == "remove":
        path.unlink()
        return f"{relative}: removed"
    path.unlink()
    path.symlink_to(elsewhere / relative)
    return f"{relative}: a link to the same file of another store"


def _replace(document: Any, steps: list[int], value: Any, delete: bool) -> str:
    """Walk ``document`` down ``steps`` (each an index into the keys or items there) and replace, or delete, what
    the walk ends on; the path taken, in words."""
    node, key, trail = document, None, []
    for step in steps:
        children = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
        if not children:
            break
        child_key = children[step % len(children)]
        if key is not None:
            trail.append(str(key))
        parent, key = node, child_key
        node = node[child_key]
    if key is None:
        return "nothing to replace"
    trail.append(str(key))
    if delete and isinstance(parent, dict):
        del parent[key]
        return f"{'.'.join(trail)} removed"
    parent[key] = value
    return f"{'.'.join(trail)} = {json.dumps(value)[:80]}"


NUMBERS = st.sampled_from(["1e309", "-1e309", "nan", "inf", "-0", "0", "9" * 400, "-1", "1e-400", "0x10", "1_0"])
"""What a damaged log may hold where a number was."""


@st.composite
def file_mutations(draw: st.DrawFn) -> dict[str, Any]:
    """One damage to a file another program wrote (a log, an event file), as data (``damage_file`` applies
    it): a line replaced, removed or repeated, a number replaced by an extreme one, the file cut, bytes flipped,
    or garbage."""
    action = draw(st.sampled_from(["line", "drop", "repeat", "number", "number", "truncate", "flip", "garbage"]))
    mutation: dict[str, Any] = {"action": action, "line": draw(st.integers(0, 10_000))}
    if action == "line":
        mutation["text"] = draw(st.text(max_size=80))
    elif action == "number":
        mutation.update(number=draw(NUMBERS), which=draw(st.integers(0, 20)))
    elif action == "repeat":
        mutation["times"] = draw(st.integers(2, 50))
    elif action == "truncate":
        mutation["keep"] = draw(st.floats(0, 1))
    elif action == "flip":
        mutation["at"] = draw(st.lists(st.floats(0, 1), min_size=1, max_size=8))
    else:
        mutation["data"] = draw(st.binary(max_size=256))
    return mutation


def damage_file(path: Path, mutation: dict[str, Any]) -> str:
    """Apply ``mutation`` to the file at ``path``; what was done, in words."""
    data, action = path.read_bytes(), mutation["action"]
    lines = data.split(b"\n")
    index = mutation["line"] % len(lines)
    if action == "line":
        lines[index] = mutation["text"].encode("utf-8", "surrogatepass")
    elif action == "drop":
        del lines[index]
    elif action == "repeat":
        lines[index:index + 1] = [lines[index]] * mutation["times"]
    elif action == "number":
        numbers = list(re.finditer(rb"-?\d+(\.\d+)?(e-?\d+)?", lines[index]))
        if numbers:
            found = numbers[mutation["which"] % len(numbers)]
            lines[index] = lines[index][:found.start()] + mutation["number"].encode() + lines[index][found.end():]
    if action in ("line", "drop", "repeat", "number"):
        path.write_bytes(b"\n".join(lines))
        return f"{path.name}: line {index + 1}: {action}"
    return f"{path.name}: {damage_bytes(path, mutation)}"


def damage_bytes(path: Path, mutation: dict[str, Any]) -> str:
    """The file cut, its bytes flipped, or replaced by garbage (``mutation["action"]``); what was done."""
    data = path.read_bytes()
    if mutation["action"] == "truncate":
        path.write_bytes(data[: int(mutation["keep"] * len(data))])
        return f"cut to {int(mutation['keep'] * len(data))} of {len(data)} bytes"
    if mutation["action"] == "flip":
        buffer = bytearray(data) or bytearray(b"\0")
        for at in mutation["at"]:
            buffer[min(len(buffer) - 1, int(at * len(buffer)))] ^= 0xFF
        path.write_bytes(bytes(buffer))
        return "bytes flipped"
    path.write_bytes(mutation["data"])
    return f"replaced by {len(mutation['data'])} bytes of garbage"
