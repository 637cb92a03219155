"""Foreign files are checked before they are trusted: each importer refuses a damaged file in one line that names the
file and the record or line, before it reads part of it as a whole, or sizes memory or a store by a number in it."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.dumps import EXPERTS, router_choices, write_router_traces
from tests.helpers.event_files import frame, masked_crc32c, record_spans, with_length, write_megatron_events
from workbench.cli import main
from workbench.errors import GoldenFileError, ImportFormatError
from workbench.importers import read_te_log, read_tensorboard
from workbench.importers import table as table_module
from workbench.importers.event_file import check_event_file
from workbench.importers.event_file import masked_crc32c as workbench_crc
from workbench.importers.megatron_tb import import_megatron_tensorboard
from workbench.importers.table import MAX_UNLOGGED_STEPS, table_arrays
from workbench.importers.te_log import MAX_LINE_BYTES
from workbench.megatron_lm.dumps import import_megatron_dumps
from workbench.megatron_lm.router_traces import MAX_EXPERTS, MAX_LAYERS
from workbench.store import golden_file
from workbench.store.golden_file import GOLDEN_MAX_BYTES, read_golden_document
from workbench.store.reader import open_run

ITERATIONS = range(1, 9)


@pytest.fixture
def events(tmp_path: Path) -> Path:
    """An event file of 8 iterations of Megatron-LM's scalars: 49 records (the file-version record first)."""
    return write_megatron_events(tmp_path / "tb", ITERATIONS)


def _import_megatron(logdir: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["import-megatron", str(logdir), "--out", str(out)])
    return code, capsys.readouterr().err.strip().splitlines()


# -- TensorBoard event files ---------------------------------------------------------------------------------------


def test_the_record_crc_is_tensorboard_s_and_an_intact_file_passes(events: Path) -> None:
    for data in (b"", b"x", os.urandom(100), events.read_bytes()[:12]):
        assert workbench_crc(data) == masked_crc32c(data)
    assert check_event_file(events) == len(record_spans(events.read_bytes())) == 49


def test_a_flipped_data_crc_is_refused_not_imported_in_part(events: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # the probe: TensorBoard stops at the bad 40th record and the first 6 iterations imported as a complete run
    data = bytearray(events.read_bytes())
    offset, length = record_spans(bytes(data))[39]
    data[offset + 12 + length] ^= 0x01
    events.write_bytes(bytes(data))
    code, err = _import_megatron(events.parent, tmp_path / "run", capsys)
    assert code == 2 and len(err) == 1, err
    assert str(events) in err[0] and f"record 40 (byte {offset:,})" in err[0] and "CRC" in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("crc", [True, False], ids=["length-crc-right", "length-crc-wrong"])
def test_a_length_of_a_terabyte_is_refused_before_anything_is_allocated(events: Path, tmp_path: Path, crc: bool,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    offset, _ = record_spans(events.read_bytes())[20]
    events.write_bytes(with_length(events.read_bytes(), offset, 1 << 40, crc=crc))
    code, err = _import_megatron(events.parent, tmp_path / "run", capsys)  # before: MemoryError, a traceback
    assert code == 2 and len(err) == 1 and "record 21" in err[0], err
    assert ("claims 1,099,511,627,776 bytes of data, more than the whole file" if crc else
            "length field fails its CRC") in err[0], err


def test_a_file_cut_inside_a_record_is_refused(events: Path) -> None:
    data = events.read_bytes()
    offset, length = record_spans(data)[30]
    for cut in (offset + 5, offset + 12 + length // 2, offset + 14 + length):
        events.write_bytes(data[:cut])
        with pytest.raises(ImportFormatError, match="record 31 .*the file ends inside the record"):
            import_megatron_tensorboard(events.parent, events.parent.parent / "run")
        assert not (events.parent.parent / "run").exists()


def test_per_site_statistics_are_checked_too(tmp_path: Path) -> None:
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(frame([b"x" * 30])[:-1])
    with pytest.raises(ImportFormatError, match="record 1 "):
        read_tensorboard(tmp_path / "tb")


def test_an_intact_record_that_is_no_event_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(frame([b"\xff" * 9]))
    code, err = _import_megatron(tmp_path / "tb", tmp_path / "run", capsys)
    assert code == 2 and len(err) == 1 and "not a TensorBoard event" in err[0], err


def test_an_iteration_far_beyond_the_events_is_refused(tmp_path: Path) -> None:
    path = write_megatron_events(tmp_path / "tb", [1, 2, 2**31 - 1])
    with pytest.raises(ImportFormatError, match="iteration 2,147,483,647: step 2,147,483,646 is beyond"):
        import_megatron_tensorboard(path.parent, tmp_path / "run")  # before: a store of 2^31 steps, written


# -- Transformer Engine debug logs ----------------------------------------------------------------------------------


def _te_line(key: str, iteration: int | str, value: float) -> str:
    return f"2025-03-01 12:00:00,123 - INFO - {key} \t\t\t\t iteration={iteration} \t\t\t\t value={value}\n"


def _te_log(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines))
    return path


def test_a_te_log_line_longer_than_the_bound_is_refused_naming_it(tmp_path: Path) -> None:
    lines = [_te_line("decoder.layers.0.mlp.linear_fc1_output_max", i, 1.5) for i in range(3)]
    log = _te_log(tmp_path / "a.log", [*lines, "x" * (MAX_LINE_BYTES + 1) + "\n", *lines])
    with pytest.raises(ImportFormatError, match=r"a\.log:4: a line of more than 1,048,576 bytes"):
        read_te_log(log)  # before: read whole, the line skipped
    log.write_text("".join(lines) + "x" * (3 * MAX_LINE_BYTES))  # the last line, without its newline
    with pytest.raises(ImportFormatError, match=r"a\.log:4: a line of more than"):
        read_te_log(log)


@pytest.mark.parametrize("iteration, says", [
    ("9" * 400, r"b\.log:3: its iteration has more than 18 digits"),  # before: read as 2^63 - 1
    (2**31 - 1, r"b\.log:3: the iteration: step 2,147,483,647 is beyond"),  # before: a store of 2^31 steps, written
])
def test_a_te_log_iteration_no_store_can_hold_is_refused_naming_the_line(tmp_path: Path, iteration: int | str,
                                                                         says: str) -> None:
    key = "decoder.layers.0.mlp.linear_fc1_output_max"
    log = _te_log(tmp_path / "b.log", ["begin\n", _te_line(key, 1, 0.5), _te_line(key, iteration, 1.5)])
    with pytest.raises(ImportFormatError, match=says):
        read_te_log(log)
    log.write_text(_te_line(key, 1, 0.5) + _te_line(key, MAX_UNLOGGED_STEPS, 1.5))  # a late start is fine
    assert read_te_log(log)["step"].tolist() == [1, MAX_UNLOGGED_STEPS]


def test_a_te_log_is_read_in_memory_the_size_of_its_numbers_not_its_text(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.importers import te_log

    monkeypatch.setattr(te_log, "_BLOCK_BYTES", 1 << 16)  # many blocks, and lines cut between them
    keys = [f"layers.{layer}.mlp.linear_fc1_output_{stat}" for layer in range(8)
            for stat in ("min", "max", "l2_norm", "mean")]
    text = "".join(_te_line(k, f"{step:06d}", round((step + i) % 97 / 7, 4))
                   for step in range(1500) for i, k in enumerate(keys))  # TE's lines, about 110 bytes each
    log = _te_log(tmp_path / "c.log", [text])
    tracemalloc.start()
    try:
        table = read_te_log(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(table) == 1500 * len(keys) and table["step"].iloc[-1] == 1499
    assert table["value"].iloc[33] == round((1 + 1) % 97 / 7, 4) and table["stat"].iloc[2] == "l2"
    # before: the whole text, then a tuple of three strings per line: about three times the file
    assert peak < len(text) / 2, f"peak {peak:,} bytes for a log of {len(text):,}"


def test_table_arrays_keeps_the_first_value_in_blocks_as_a_plain_reference_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    rows = 400
    table = pd.DataFrame({"step": rng.integers(0, 9, rows), "site": rng.choice(["act:a", "act:b", "act:c"], rows),
                          "stat": rng.choice(["min", "max", "mean"], rows),
                          "value": rng.choice([1.0, 2.0, np.nan], rows)})
    reference = {}  # (step, site, stat) -> the first value logged
    for row in table.itertuples():
        reference.setdefault((row.step, row.site, row.stat), row.value)
    for block in (1 << 20, 7):
        monkeypatch.setattr(table_module, "_ROWS_AT_ONCE", block)
        arrays = table_arrays(table)
        got = {(int(step), site, stat): arrays.values[i, j, k] for i, step in enumerate(arrays.steps)
               for j, site in enumerate(arrays.sites) for k, stat in enumerate(arrays.stats) if arrays.present[i, j, k]}
        assert got.keys() == reference.keys()
        differ = [key for key in got if not np.array_equal(got[key], reference[key], equal_nan=True)]
        assert not differ, f"block {block}: {len(differ)} cells differ, first {differ[0]}"
        conflicts = table.groupby(["step", "site", "stat"])["value"].apply(
            lambda v: len({x.tobytes() for x in v.to_numpy()}) > 1).sum()
        assert arrays.conflicting_duplicates == conflicts


def test_a_table_that_would_be_mostly_empty_cells_is_refused() -> None:
    rows = 5000  # every value at its own step and site: 25 million cells for 5000 values
    table = pd.DataFrame({"step": np.arange(rows), "site": [f"act:s{i}" for i in range(rows)], "stat": "min",
                          "value": 1.0})
    with pytest.raises(ImportFormatError, match="would fill 25,000,000 cells"):
        table_arrays(table)


# -- router traces -------------------------------------------------------------------------------------------------


def _trace(tmp_path: Path, extra: str | bytes | None = None, rank: int = 1) -> Path:
    traces = write_router_traces(tmp_path / "traces", router_choices())
    if extra is not None:
        with (traces / f"router_trace_rank{rank}.jsonl").open("ab") as log:
            log.write((extra.encode() if isinstance(extra, str) else extra) + b"\n")
    return traces


def _line(**fields: object) -> str:
    return json.dumps({"step": 0, "stage": "pre_dispatch", "block": "decoder", "layer": 0, "rank": 1,
                       "num_tokens": 1, "topk": 2, "top_indices": [[0, 1]], **fields})


@pytest.mark.parametrize("line, experts, says", [
    (_line(top_indices=[[0, 2**31 - 1]]), None, f'"top_indices" routes to expert 2,147,483,647 of the '
     f"{MAX_EXPERTS:,}"),  # before: a 16 GiB bincount
    (_line(top_indices=[[0, 5]]), EXPERTS, '"top_indices" routes to expert 5 of 4'),
    (_line(step=2**31 - 1), None, '"step": step 2,147,483,647 is beyond'),  # before: a store of 2^31 steps
    (_line(layer=MAX_LAYERS), None, f'"layer" {MAX_LAYERS:,}: more than'),
    (_line(rank=0), None, '"rank" is 0, but the line\'s file'),
    (_line(num_tokens=10**9), None, '"num_tokens" is 1000000000'),
    (_line(topk=3), None, '"topk" is 3'),
    (b'{"step": 0, "top_indices": "\xff\xfe"}', None, "not a JSON line"),  # before: UnicodeDecodeError
], ids=["expert-2^31", "expert-beyond-the-model", "step-2^31", "layer", "rank", "num_tokens", "topk", "not-utf-8"])
def test_a_router_trace_number_is_bounded_before_it_sizes_anything(tmp_path: Path, line: str | bytes,
                                                                   experts: int | None, says: str) -> None:
    traces = _trace(tmp_path, line)
    lines = len((traces / "router_trace_rank1.jsonl").read_bytes().splitlines())
    with pytest.raises(ImportFormatError) as refused:
        import_megatron_dumps(traces, tmp_path / "run", router_traces=traces, experts=experts,
                              progress=lambda line: None)
    message = str(refused.value)
    assert f"router_trace_rank1.jsonl:{lines}: " in message and says in message, message
    assert "\n" not in message and not (tmp_path / "run").exists()


def test_a_rank_file_beyond_the_ranks_present_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = _trace(tmp_path)
    (traces / "router_trace_rank1.jsonl").rename(traces / "router_trace_rank1000000.jsonl")
    code = main(["import-megatron-dumps", str(traces), "--router-traces", str(traces), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "rank 1,000,000, but the folder holds 2 rank files" in err[0], err
    assert "rank 1 is missing" in err[0]


def test_a_trace_that_starts_late_is_still_read(tmp_path: Path) -> None:
    traces = _trace(tmp_path)
    for log in traces.iterdir():  # a resumed run: the tracer stamps the iteration it resumed at
        log.write_text("".join(json.dumps({**json.loads(line), "step": json.loads(line)["step"] + 1000}) + "\n"
                               for line in log.read_text().splitlines()))
    run = import_megatron_dumps(traces, tmp_path / "run", router_traces=traces, progress=lambda line: None)
    assert open_run(run).records().steps == [1000, 1001, 1002]


# -- golden files --------------------------------------------------------------------------------------------------


def test_a_golden_file_beyond_the_bound_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "golden.json"
    with path.open("wb") as file:  # sparse: no disk, no time
        file.truncate(GOLDEN_MAX_BYTES + 1)

    def read(*args: object, **kwargs: object) -> None:
        raise AssertionError("the golden file was read")

    monkeypatch.setattr(golden_file, "strict_json", read)
    with pytest.raises(GoldenFileError, match=f"{GOLDEN_MAX_BYTES + 1:,} bytes, more than the {GOLDEN_MAX_BYTES:,} "
                                              r"\(GOLDEN_MAX_BYTES\)"):
        read_golden_document(path)
