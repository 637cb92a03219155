"""TensorBoard event files as Megatron-LM writes them, and their TFRecord framing taken apart and put back.

    path = write_megatron_events(tmp_path / "tb", iterations=range(1, 9))   # 6 records an iteration, and a header
    spans = record_spans(path.read_bytes())                                 # [(offset, length)] per record
    path.write_bytes(frame([b"not an event"]))                              # records whose CRCs hold
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path


def masked_crc32c(data: bytes) -> int:
    """TensorBoard's own TFRecord CRC (pure Python): the reference the workbench's checks are held to."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboard_crc

    return int(tensorboard_crc(data))

TAGS = ("lm loss", "grad-norm", "iteration-time", "num-zeros", "learning-rate", "lm loss vs samples")
"""The scalars each iteration logs: one event (one record) each."""


def write_megatron_events(logdir: Path, iterations: Iterable[int]) -> Path:
    """One event file of Megatron-LM's per-iteration scalars (``TAGS``) in ``logdir``; returns the file."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir.mkdir(parents=True)
    writer = EventFileWriter(str(logdir))
    for k in iterations:
        for i, tag in enumerate(TAGS):
            writer.add_event(Event(wall_time=0.0, step=k, summary=Summary(value=[
                Summary.Value(tag=tag, simple_value=10.0 - 0.25 * k + i)])))
    writer.close()
    (path,) = logdir.glob("*tfevents*")
    return path


def record_spans(data: bytes) -> list[tuple[int, int]]:
    """(offset, data length) of each record of an intact event file."""
    spans, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        spans.append((offset, length))
        offset += 16 + length
    return spans


def frame(payloads: Iterable[bytes]) -> bytes:
    """Records around ``payloads``, their lengths and CRCs right."""
    out = bytearray()
    for payload in payloads:
        length = struct.pack("<Q", len(payload))
        out += length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))
    return bytes(out)


def with_length(data: bytes, offset: int, length: int, *, crc: bool = True) -> bytes:
    """``data`` with the length field of the record at ``offset`` replaced (its CRC made to match, with ``crc``)."""
    field = struct.pack("<Q", length)
    check = struct.pack("<I", masked_crc32c(field)) if crc else data[offset + 8:offset + 12]
    return data[:offset] + field + check + data[offset + 12:]
