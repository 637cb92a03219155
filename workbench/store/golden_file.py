"""Golden-values files on disk: read one as untrusted JSON, write one whole or not at all.

What a golden file means, and both formats, is ``analysis.golden_values`` (which reads no file):

    golden = parse_golden_values(read_golden_document(path), str(path))
    write_golden_document(workbench_golden_values(...), "golden.json")
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.disk import written
from workbench.errors import GoldenFileError
from workbench.untrusted import JsonRefused, strict_json

GOLDEN_MAX_BYTES = 64 << 20
"""The largest golden file read, checked before it is opened: real ones are a few MB; 64 MiB is about a million
steps of four metrics in Megatron-LM's format, which takes seconds and half a gigabyte to parse."""


def read_golden_document(path: str | os.PathLike[str]) -> Any:
    """The JSON a golden file holds (bounded by ``GOLDEN_MAX_BYTES`` and strict: ``untrusted.strict_json``;
    Megatron's own NaN is the string ``"nan"``, never the literal); ``GoldenFileError`` in one line for a missing
    file, one too large, or one that is not such JSON."""
    path = Path(path)
    if not path.is_file():
        raise GoldenFileError(f"{path}: no such golden-values file")
    size = path.stat().st_size
    if size > GOLDEN_MAX_BYTES:  # refused before a byte is read
        raise GoldenFileError(f"{path}: {size:,} bytes, more than the {GOLDEN_MAX_BYTES:,} (GOLDEN_MAX_BYTES) a "
                              "golden file may hold; write one of fewer steps (`workbench golden RUN --steps N`)")
    try:
        return strict_json(path)
    except JsonRefused as err:
        raise GoldenFileError(f"{path}: refused: {err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GoldenFileError(f"{path}: not JSON ({err}); expected Megatron-LM's golden_values_*.json format "
                              "or a workbench golden file (`workbench golden RUN --out FILE`)") from None


def write_golden_document(data: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``data`` as JSON at ``path`` (its folder made): a reader sees the old file or the whole new one, and a
    failed write (``path`` a folder, a full disk) leaves nothing behind."""
    path = Path(path)
    text = (json.dumps(data, indent=1, allow_nan=False) + "\n").encode("utf-8")
    with written(path, needed=len(text)) as partial:
        partial.write_bytes(text)
    return path
