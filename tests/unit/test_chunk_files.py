"""Rows read straight from the chunk files (``store.chunk_files``) against Zarr's own read of the same selection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, GzipCodec

from workbench.errors import DamagedStoreError
from workbench.store import chunk_files, layout


def _array(root: Path, name: str, data: np.ndarray, *, chunks: tuple[int, ...],
           shards: tuple[int, ...] | None = None, every_chunk: bool = True, **spec: object) -> zarr.Array:
    """An array written as the run store writes its own (``writer._array``)."""
    group = zarr.open_group(root, mode="a")
    config = layout.WRITE_EVERY_CHUNK if every_chunk else {}
    with zarr.config.set(config):
        node = group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunks, shards=shards,
                                  compressors=spec.pop("compressors", layout.COMPRESSORS), **spec)
        node[...] = data
    return zarr.open_array(root / name, mode="r")


def _same(got: np.ndarray | None, node: zarr.Array, selection: object) -> None:
    """``got`` is Zarr's ``node[selection]``, bit for bit (NaN payloads included)."""
    assert got is not None, "read through Zarr, not from the files"
    expected = np.asarray(node[selection])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes(), f"max difference {np.nanmax(np.abs(got - expected))}"


SELECTIONS = [slice(None), slice(0, 64), slice(5, 150), slice(63, 65), slice(130, 131), slice(140, 10_000),
              slice(7, 7), slice(200, 300)]


@pytest.mark.parametrize("selection", SELECTIONS)
def test_rows_of_chunked_arrays_are_zarrs(tmp_path: Path, selection: slice) -> None:
    rng = np.random.default_rng(0)
    fingerprints = _array(tmp_path, "fp", rng.integers(0, 2**63, (131, 9), dtype=np.uint64), chunks=(64, 9))
    scalars = _array(tmp_path, "loss", rng.standard_normal(131), chunks=(64,))
    flags = _array(tmp_path, "skipped", rng.integers(0, 2, 131).astype(np.int8), chunks=(64,))
    done = _array(tmp_path, "done", rng.integers(0, 2, 131).astype(bool), chunks=(64,))
    for node in (fingerprints, scalars, flags, done):
        _same(layout.read(node, selection), node, selection)
        _same(chunk_files.read_selection(node, selection), node, selection)


@pytest.mark.parametrize("per_chunk", [1, 2, 6])
@pytest.mark.parametrize("selection", SELECTIONS)
def test_rows_and_one_statistic_of_sharded_arrays_are_zarrs(tmp_path: Path, per_chunk: int,
                                                            selection: slice) -> None:
    values = np.random.default_rng(1).standard_normal((131, 5, 6))
    values[3, 2, 4], values[70, 0, 0] = np.nan, np.inf
    stats = _array(tmp_path, "stats", values, chunks=(64, 5, per_chunk), shards=(64, 5, 6))
    _same(chunk_files.read_selection(stats, selection), stats, selection)
    for column in (0, 4, 5):
        _same(chunk_files.read_selection(stats, (selection, slice(None), column)), stats,
              (selection, slice(None), column))


def test_chunks_never_written_read_as_the_fill_value(tmp_path: Path) -> None:
    values = np.random.default_rng(2).standard_normal((131, 5, 6))
    values[64:128, :, 2] = np.nan  # an inner chunk of fill values: left out of its shard's index
    stats = _array(tmp_path, "stats", values, chunks=(64, 5, 1), shards=(64, 5, 6), every_chunk=False)
    fingerprints = _array(tmp_path, "fp", np.ones((131, 5), dtype=np.uint64), chunks=(64, 5))
    (tmp_path / "fp" / "c" / "1" / "0").unlink()  # a whole file missing
    (tmp_path / "stats" / "c" / "2" / "0" / "0").unlink()
    for node, selection in ((stats, slice(None)), (stats, (slice(None), slice(None), 2)), (fingerprints, slice(None))):
        _same(chunk_files.read_selection(node, selection), node, selection)
    assert np.isnan(chunk_files.read_rows(stats, slice(64, 128), column=2)).all()


def test_what_it_does_not_read_is_left_to_zarr(tmp_path: Path) -> None:
    data = np.arange(200, dtype=np.float64).reshape(100, 2)
    gzip = _array(tmp_path, "gzip", data, chunks=(64, 2), compressors=(GzipCodec(),))
    columns = _array(tmp_path, "columns", data, chunks=(64, 1))  # files that split a row
    big = _array(tmp_path, "big", data, chunks=(64, 2), serializer=BytesCodec(endian="big"))
    names = _array(tmp_path, "names", np.array(["a", "b"] * 50, dtype=str), chunks=(64,), compressors=None)
    memory = zarr.create_array(zarr.storage.MemoryStore(), shape=data.shape, dtype=data.dtype, chunks=(64, 2),
                               compressors=layout.COMPRESSORS)
    memory[...] = data
    plain = _array(tmp_path, "plain", data, chunks=(64, 2))
    for node in (gzip, columns, big, names, memory):
        assert chunk_files.read_selection(node, slice(None)) is None
        assert np.array_equal(layout.read(node, slice(None)), node[...])
    for selection in (3, slice(0, 10, 2), (slice(None), 1), [1, 2], Ellipsis, (slice(None), slice(0, 1))):
        assert chunk_files.read_selection(plain, selection) is None, selection
        assert np.array_equal(layout.read(plain, selection), plain[selection])


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["chunk byte", "index byte", "truncated", "index offset"])
def test_a_damaged_shard_is_damage_as_through_zarr(tmp_path: Path, damage: str) -> None:
    values = np.random.default_rng(3).standard_normal((131, 50, 4))
    stats = _array(tmp_path, "stats", values, chunks=(64, 50, 1), shards=(64, 50, 4))
    shard = tmp_path / "stats" / "c" / "1" / "0" / "0"
    size = shard.stat().st_size
    if damage == "chunk byte":
        _flip(shard, 40)
    elif damage == "index byte":
        _flip(shard, size - 10)
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[: size // 2])
    else:  # an index that points past the data, its checksum made to match
        import google_crc32c

        data = bytearray(shard.read_bytes())
        index = np.frombuffer(bytes(data[-68:-4]), dtype="<u8").copy()
        index[0] = size
        data[-68:-4] = index.tobytes()
        data[-4:] = google_crc32c.value(bytes(data[-68:-4])).to_bytes(4, "little")
        shard.write_bytes(bytes(data))
    with pytest.raises(DamagedStoreError, match=r"stats: a chunk cannot be read \(file c/1/0/0: "):
        chunk_files.read_rows(stats, slice(None), column=0)
    with pytest.raises(DamagedStoreError, match="stats: a chunk cannot be read"):
        layout.read(stats, slice(0, 131))
    if damage != "index offset":  # Zarr 3.1 reads a chunk past the data as fill values; here it is damage
        with pytest.raises(Exception):  # noqa: B017, PT011 - Zarr fails on it too, with one of several types
            np.asarray(stats[0:131, :, 0])
    assert chunk_files.read_rows(stats, slice(0, 64), column=0) is not None  # the other shards still read


@pytest.mark.parametrize("row_block", [0, 2])  # a file of rows all read (decoded in place), the last one's part
def test_a_damaged_chunk_is_damage(tmp_path: Path, row_block: int) -> None:
    fingerprints = _array(tmp_path, "fp", np.arange(131 * 3, dtype=np.uint64).reshape(131, 3), chunks=(64, 3))
    chunk = tmp_path / "fp" / "c" / str(row_block) / "0"
    _flip(chunk, chunk.stat().st_size - 2)  # the zstd frame's content checksum
    with pytest.raises(DamagedStoreError, match=rf"fp: a chunk cannot be read \(file c/{row_block}/0: "):
        layout.read(fingerprints, slice(None))
    with pytest.raises(Exception):  # noqa: B017, PT011
        np.asarray(fingerprints[...])


@pytest.mark.parametrize("size", [0, 1, 200, 300, 70_000, 1 << 20])
def test_the_decoded_size_a_frame_declares(size: int) -> None:
    from numcodecs.zstd import Zstd

    frame = Zstd(level=0, checksum=True).encode(np.random.default_rng(size).bytes(size))
    assert chunk_files._content_size(bytes(frame)) == size
    assert chunk_files._content_size(b"not a zstd frame") is None


def test_a_pausing_read_waits_before_each_file_and_decodes_in_its_own_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(2).standard_normal((300, 1000))  # 2.4 MB: threaded unless it pauses
    node = _array(tmp_path, "stats", values, chunks=(64, 1000))
    waits: list[int] = []
    monkeypatch.setattr(chunk_files, "_THREADS", 2)

    def no_pool() -> None:
        raise AssertionError("a pausing read handed its files to the shared threads")

    monkeypatch.setattr(chunk_files, "_pool", no_pool)
    _same(chunk_files.read_selection(node, slice(10, 290), pause=lambda: waits.append(1)), node, slice(10, 290))
    assert len(waits) == 5  # files 0..4
    with pytest.raises(AssertionError, match="shared threads"):  # a read without pause: threaded
        chunk_files.read_selection(node, slice(None))
