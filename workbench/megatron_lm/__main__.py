"""Record Megatron-LM's ``pretrain()`` without editing it: the entry script runs as itself, with the
workbench's recording hook on ``train_step`` (``workbench.megatron_lm.pretrain``).

    torchrun --nproc-per-node 8 -m workbench.megatron_lm pretrain_gpt.py MEGATRON_ARGS... --workbench-run DIR

``--workbench-run DIR`` (required) is the run store to write; ``--workbench-flush-every N`` how often its
per-site records are reduced and written (default: the recorder's). Both are taken out of the arguments
before the entry script sees them. On a machine without a GPU the patches of ``workbench.megatron_lm.cpu``
are applied first, so a small ``pretrain()`` trains on gloo (``--distributed-backend gloo``).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import NoReturn

_USAGE = ("usage: torchrun ... -m workbench.megatron_lm ENTRY.py [MEGATRON_ARGS...] --workbench-run DIR "
          "[--workbench-flush-every N]")


def _refuse(message: str) -> NoReturn:
    print(f"workbench.megatron_lm: error: {message}\n{_USAGE}", file=sys.stderr)
    raise SystemExit(2)


def split_arguments(argv: list[str]) -> tuple[Path, int | None, list[str]]:
    """(run folder, flush interval, the entry script and its own arguments) from the launcher's arguments."""
    run_dir: Path | None = None
    flush_every: int | None = None
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        name, _, inline = item.partition("=")
        if name in ("--workbench-run", "--workbench-flush-every"):
            value = inline or next(items, None)
            if value is None:
                _refuse(f"{name} needs a value")
            if name == "--workbench-run":
                run_dir = Path(value)
            elif not value.isdigit() or int(value) < 1:
                _refuse(f"--workbench-flush-every {value!r}: a whole number >= 1")
            else:
                flush_every = int(value)
        else:
            rest.append(item)
    if run_dir is None or not rest or not rest[0].endswith(".py") or not Path(rest[0]).is_file():
        _refuse("an entry script (an existing .py file) and --workbench-run DIR are needed")
    return run_dir, flush_every, rest


def main(argv: list[str] | None = None) -> None:
    run_dir, flush_every, rest = split_arguments(list(sys.argv[1:] if argv is None else argv))
    import torch

    if not torch.cuda.is_available():
        from workbench.megatron_lm import cpu

        cpu.install()
    from workbench.megatron_lm.pretrain import PretrainRecording

    recording = PretrainRecording(run_dir, flush_every=flush_every)
    recording.install()
    sys.argv = rest
    try:
        runpy.run_path(rest[0], run_name="__main__")
    except BaseException as error:
        recording.close(error)
        raise
    recording.close()


if __name__ == "__main__":
    main()
