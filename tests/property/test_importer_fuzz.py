"""The files other programs write, damaged, read in this process by each importer's reader: TensorBoard event files
(bytes flipped, the file cut, a length field changed, intact records around garbage), Transformer Engine debug logs
(random lines among real ones, read in blocks of a few bytes), Megatron's router traces (a random JSON value in one
field of one line), golden files (random JSON in either format's places, or bytes).

Every reader returns a result or raises a ``WorkbenchError`` (one line at the command line): never another
exception, never a hang (each example is a few kB), and a damaged event file never imports as a complete run. The
examples are derandomized, the same ones in every run (``WORKBENCH_FUZZ_EXAMPLES`` sets how many, 150 by default;
``WORKBENCH_FUZZ_RANDOM=1`` draws new ones). ``tests/property/test_store_fuzz.py`` runs the verbs on such files in
a process with a memory limit.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.dumps import EXPERTS, router_choices, write_router_traces
from tests.helpers.event_files import frame, record_spans, with_length, write_megatron_events
from workbench.analysis.golden_values import parse_golden_values
from workbench.errors import WorkbenchError
from workbench.importers import te_log
from workbench.importers.megatron_tb import import_megatron_tensorboard, read_megatron_scalars
from workbench.importers.table import MAX_UNLOGGED_STEPS, table_arrays
from workbench.importers.tensorboard import read_tensorboard
from workbench.megatron_lm.router_traces import MAX_EXPERTS, read_router_traces, router_trace_files
from workbench.store.golden_file import read_golden_document
from workbench.store.reader import open_run
from workbench.testing.damage import JSON_VALUES, NUMBERS

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("WORKBENCH_FUZZ_RANDOM") == "1"
FUZZ = settings(max_examples=EXAMPLES, derandomize=not RANDOM, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An event file of 3 iterations (19 records) and a router trace folder (2 ranks, 24 lines each)."""
    root = tmp_path_factory.mktemp("pristine")
    events = write_megatron_events(root / "tb", range(1, 4))
    return {"events": events.read_bytes(), "event_name": events.name,
            "traces": write_router_traces(root / "traces", router_choices())}


@contextmanager
def fresh_folder() -> Iterator[Path]:
    """A folder of one example's own (a function-scoped fixture would be shared by every example)."""
    with tempfile.TemporaryDirectory(prefix="importer-fuzz-") as folder:
        yield Path(folder)


def answers(read: Callable[[], Any]) -> Any:
    """What ``read`` returns, or None where it raised a ``WorkbenchError``; any other exception fails the test."""
    try:
        return read()
    except WorkbenchError as refused:
        assert "\n" not in str(refused), f"not one line: {refused}"
        return None


# -- TensorBoard event files ---------------------------------------------------------------------------------------

EVENT_DAMAGE = st.one_of(
    st.fixed_dictionaries({"action": st.just("flip"), "at": st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)),
                                                                     min_size=1, max_size=6)}),
    st.fixed_dictionaries({"action": st.just("cut"), "keep": st.floats(0, 1)}),
    st.fixed_dictionaries({"action": st.just("length"), "record": st.integers(0, 100),
                           "length": st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**31, 2**40, 2**63]),
                           "crc": st.booleans()}),
    st.fixed_dictionaries({"action": st.just("reframe"), "record": st.integers(0, 100),
                           "payload": st.binary(max_size=64)}),
)


def damage_events(data: bytes, damage: dict[str, Any]) -> tuple[bytes, bool]:
    """``data`` damaged, and whether the damage can be seen: a cut between records leaves a shorter file that is
    whole, and a record put back with its CRCs right is intact framing around other bytes."""
    spans = record_spans(data)
    if damage["action"] == "flip":
        out = bytearray(data)
        for at, mask in damage["at"]:
            out[min(len(out) - 1, int(at * len(out)))] ^= mask
        return bytes(out), bytes(out) != data
    if damage["action"] == "cut":
        keep = int(damage["keep"] * len(data))
        return data[:keep], keep not in {offset for offset, _ in spans} | {len(data)}
    offset, length = spans[damage["record"] % len(spans)]
    if damage["action"] == "length":
        out = with_length(data, offset, damage["length"], crc=damage["crc"])
        return out, out != data
    return data[:offset] + frame([damage["payload"]]) + data[offset + 16 + length:], False


@FUZZ
@given(damage=EVENT_DAMAGE)
def test_a_damaged_event_file_is_refused_and_never_imports_as_complete(damage: dict[str, Any],
                                                                       pristine: dict[str, Any]) -> None:
    data, seen = damage_events(pristine["events"], damage)
    with fresh_folder() as case:
        logdir = case / "tb"
        logdir.mkdir()
        (logdir / pristine["event_name"]).write_bytes(data)
        scalars = answers(lambda: read_megatron_scalars(logdir))
        answers(lambda: read_tensorboard(logdir))
        run = answers(lambda: import_megatron_tensorboard(logdir, case / "run"))
        if seen:
            assert scalars is None and run is None, f"{damage}: a damaged event file was read"
            assert not (case / "run").exists()
        elif run is not None:
            assert open_run(run).status == "complete"


# -- Transformer Engine debug logs ---------------------------------------------------------------------------------

_KEYS = ["decoder.layers.0.mlp.linear_fc1_output_max", "layers.1.self_attention.linear_qkv_weight_l2_norm",
         "module.decoder.layers.2.mlp.linear_fc2_activation_cur_amax", "optimizer_exp_avg_num_zeros", "x_gradient_",
         "layers.0.mlp_workbench.act_numel"]
STAT_LINE = st.builds(
    "{}{} \t iteration={} \t value={}".format,
    st.sampled_from(["", "2025-03-01 12:00:00,123 - INFO - ", " - "]),
    st.sampled_from(_KEYS) | st.text(max_size=30),
    st.integers(0, 300).map(str) | st.sampled_from(["9" * 19, "9" * 400, "0" * 30 + "7", str(2**31 - 1), "-1", ""]),
    NUMBERS | st.floats().map(repr) | st.sampled_from(["1.5", "-0.25e-3", ".5", "nan", "Infinity"]),
)
TE_LINES = st.lists(STAT_LINE.map(str.encode) | st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass"))
                    | st.binary(max_size=60), max_size=30)


@FUZZ
@given(lines=TE_LINES, ending=st.sampled_from([b"\n", b"\r\n"]), last_newline=st.booleans(),
       block=st.integers(1, 200), longest=st.integers(8, 300))
def test_a_te_log_of_random_lines_is_read_or_refused(lines: list[bytes], ending: bytes, last_newline: bool,
                                                     block: int, longest: int) -> None:
    with fresh_folder() as case, mock.patch.object(te_log, "_BLOCK_BYTES", block), \
            mock.patch.object(te_log, "MAX_LINE_BYTES", longest):
        log = case / "nvdlfw_inspect_globalrank-0.log"
        log.write_bytes(ending.join(lines) + (ending if last_newline else b""))
        table = answers(lambda: te_log.read_te_log(log))
    if table is not None:
        assert len(table) and table["step"].min() >= 0
        answers(lambda: table_arrays(table))


# -- router traces -------------------------------------------------------------------------------------------------

FIELDS = ["step", "stage", "block", "layer", "rank", "num_tokens", "topk", "top_indices", "mtp_idx", "hs_offset"]
WHOLE = st.integers(-2, 40) | st.sampled_from([2**31 - 1, 2**31, 10**6, 2**63, 1.5, True, "0"])
FIELD_VALUES = st.one_of(WHOLE, st.lists(st.lists(WHOLE, min_size=2, max_size=2), max_size=3),
                         st.sampled_from([[], [[]], [[0, 1], [2]], [[EXPERTS, 0]]]), JSON_VALUES)


@FUZZ
@given(rank=st.integers(0, 1), line=st.integers(0, 30), field=st.sampled_from(FIELDS), value=FIELD_VALUES,
       delete=st.booleans(), experts=st.sampled_from([None, EXPERTS]), rename=st.sampled_from([None, 2, 7, 10**6]))
def test_a_router_trace_with_a_random_value_is_read_or_refused(rank: int, line: int, field: str, value: Any,
                                                               delete: bool, experts: int | None, rename: int | None,
                                                               pristine: dict[str, Any]) -> None:
    with fresh_folder() as case:
        traces = case / "traces"
        shutil.copytree(pristine["traces"], traces)
        path = traces / f"router_trace_rank{rank}.jsonl"
        lines = path.read_text().splitlines()
        entry = json.loads(lines[line % len(lines)])
        if delete:
            entry.pop(field, None)
        else:
            entry[field] = value
        lines[line % len(lines)] = json.dumps(entry)
        path.write_text("\n".join(lines) + "\n")
        if rename is not None:
            path.rename(traces / f"router_trace_rank{rename}.jsonl")
        found = answers(lambda: read_router_traces(router_trace_files(traces), tp=1, pp=1,
                                                   layer_offsets={(0, 0): 0}, experts=experts))
        if found is not None:  # what it read sizes nothing beyond what the files hold
            steps = [step for step, *_ in found["pieces"]]  # each call's counts are made as its pieces are taken
            assert found["experts"] <= (experts or MAX_EXPERTS)
            assert max(steps) < 2 * len(lines) + MAX_UNLOGGED_STEPS


# -- golden files --------------------------------------------------------------------------------------------------

MEGATRON_ENTRY = st.fixed_dictionaries({
    "start_step": JSON_VALUES, "end_step": JSON_VALUES, "step_interval": JSON_VALUES,
    "values": st.dictionaries(st.text(max_size=6) | st.integers(-5, 10**6).map(str), JSON_VALUES | NUMBERS,
                              max_size=5)})
WORKBENCH_DOCUMENT = st.fixed_dictionaries({
    "format": st.just("workbench-golden-values"), "version": st.just(1) | JSON_VALUES,
    "fingerprint_version": JSON_VALUES, "steps": st.lists(st.integers(-3, 10) | JSON_VALUES, max_size=4),
    "scalars": st.dictionaries(st.sampled_from(["loss", "grad_norm", "lr"]) | st.text(max_size=5),
                               st.lists(JSON_VALUES, max_size=4), max_size=3),
    "weights": st.dictionaries(st.integers(-3, 10).map(str) | st.text(max_size=4), JSON_VALUES, max_size=3)})
GOLDEN = st.one_of(
    st.dictionaries(st.sampled_from(["lm loss", "num-zeros", "iteration-time"]) | st.text(max_size=8), MEGATRON_ENTRY,
                    min_size=1, max_size=3).map(json.dumps).map(str.encode),
    WORKBENCH_DOCUMENT.map(json.dumps).map(str.encode),
    JSON_VALUES.map(json.dumps).map(str.encode),
    st.binary(max_size=200),
)


@FUZZ
@given(document=GOLDEN)
def test_a_golden_file_of_random_json_is_read_or_refused(document: bytes) -> None:
    with fresh_folder() as case:
        path = case / "golden.json"
        path.write_bytes(document)
        answers(lambda: parse_golden_values(read_golden_document(path), str(path)))
