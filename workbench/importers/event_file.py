"""TensorBoard event files checked record by record, before TensorBoard's reader is given them.

    files = check_event_files("tb/")       # every events.out.tfevents.* of the folder, each record checked

An event file is a sequence of TFRecords, little-endian:

    uint64 length | uint32 masked CRC-32C of the length | data (length bytes) | uint32 masked CRC-32C of the data

``EventAccumulator`` stops reading a file at its first bad record without a word, so a damaged file would import
as a shorter run, and a length field it believes is allocated before it is read. Here a length is first checked
against its CRC, then against the bytes left in the file, then the data against its CRC, one record in memory at a
time; any failure is ``ImportFormatError`` naming the file, the record and its offset. Imports no tensorboard.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import google_crc32c  # a dependency of zarr: CRC-32C in C, about a thousand times TensorBoard's Python loop

from workbench.errors import ImportFormatError

HEADER = struct.Struct("<QI")  # length, masked CRC of the length's 8 bytes
FOOTER = struct.Struct("<I")  # masked CRC of the data
_MASK_DELTA = 0xA282EAD8
_READ_BUFFER = 1 << 20


def masked_crc32c(data: bytes) -> int:
    """TFRecord's CRC: CRC-32C rotated right by 15 bits plus a constant (a CRC of data holding CRCs stays apart)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def is_event_file(path: Path) -> bool:
    """Whether ``EventAccumulator`` reads ``path`` as an event file (its name holds ``tfevents``; TensorBoard's
    empty ``.profile-empty`` markers excepted)."""
    return "tfevents" in path.name and not path.name.endswith(".profile-empty")


def check_event_file(path: str | os.PathLike[str]) -> int:
    """The number of records in the event file at ``path``, each one's framing and CRCs checked (see the module
    docstring); ``ImportFormatError`` at the first that fails."""
    path = Path(path)
    with path.open("rb", buffering=_READ_BUFFER) as file:
        size = os.fstat(file.fileno()).st_size  # a file still being written is read up to this size
        offset, number = 0, 0
        while offset < size:
            number += 1
            where = f"{path}: record {number} (byte {offset:,})"
            header = file.read(HEADER.size)
            if len(header) < HEADER.size:
                raise _truncated(where, "its length", offset, size)
            length, length_crc = HEADER.unpack(header)
            if masked_crc32c(header[:8]) != length_crc:
                raise ImportFormatError(f"{where}: its length field fails its CRC-32C check, so the file is damaged; "
                                        "copy it again from where the run wrote it, or move it out of the folder")
            left = size - offset - HEADER.size - FOOTER.size
            if length > size:  # checked before anything is allocated: a damaged length may claim terabytes
                raise ImportFormatError(f"{where}: claims {length:,} bytes of data, more than the whole file "
                                        f"({size:,} bytes), so the file is damaged; copy it again from where the run "
                                        "wrote it, or move it out of the folder")
            if length > left:
                raise _truncated(where, f"the {length:,} bytes of data it claims", offset, size)
            data = file.read(length)
            footer = file.read(FOOTER.size)
            if len(data) < length or len(footer) < FOOTER.size:  # the file shrank while it was read
                raise _truncated(where, f"its {length:,} bytes of data", offset, size)
            if masked_crc32c(data) != FOOTER.unpack(footer)[0]:
                raise ImportFormatError(f"{where}: its {length:,} bytes of data fail their CRC-32C check, so the file "
                                        "is damaged; copy it again from where the run wrote it, or move it out of "
                                        "the folder")
            offset += HEADER.size + length + FOOTER.size
    return number


def _truncated(where: str, part: str, offset: int, size: int) -> ImportFormatError:
    return ImportFormatError(f"{where}: the file ends inside the record, before {part} ({size - offset:,} bytes "
                             "left); if the run is still writing it, import again when it has stopped, else copy it "
                             "again")


def check_event_files(logdir: str | os.PathLike[str]) -> list[Path]:
    """The event files ``EventAccumulator`` reads in ``logdir`` (sorted), each checked by ``check_event_file``."""
    files = sorted(p for p in Path(logdir).iterdir() if is_event_file(p))
    for path in files:
        if not path.is_file():
            raise ImportFormatError(f"{path}: named as an event file, but not a file; move it out of the folder")
        check_event_file(path)
    return files
