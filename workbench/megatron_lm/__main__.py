"""Record Megatron-LM's ``pretrain()`` without editing it: the entry script runs as itself, with the
workbench's recording hook on ``train_step`` (``workbench.megatron_lm.pretrain``).

    torchrun --nproc-per-node 8 -m workbench.megatron_lm pretrain_gpt.py MEGATRON_ARGS... --workbench-run DIR

``--workbench-run DIR`` (required) is the run store to write; ``--workbench-flush-every N`` how often its
per-site records are reduced and written (default: the recorder's). Both are taken out of the arguments
before the entry script sees them. On a machine without a GPU the patches of ``workbench.megatron_lm.cpu``
are applied first, so a small ``pretrain()`` trains on gloo (``--distributed-backend gloo``). On every
machine, ``keep_installed_dataset_helpers`` lets ``pretrain()`` start from the megatron-core wheel.
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


def keep_installed_dataset_helpers() -> None:
    """Skip ``pretrain()``'s build of the dataset helpers where the installed megatron-core has them built.

    On rank 0 ``training/initialize.py:155`` calls ``core/datasets/utils.py:25`` ``compile_helpers``, which runs
    ``make`` in the package's folder and exits the process when it fails. The wheel ships the compiled module
    (``helpers_cpp``) and no Makefile, so ``pretrain()`` from the wheel stopped there on a GPU (megatron-core
    0.19.2 on an H200: "make: *** No targets specified and no makefile found"). Where the module imports and
    no Makefile sits beside it there is nothing to build and the call does nothing; a checkout (a Makefile)
    builds as Megatron-LM does.
    """
    import megatron.core.datasets.utils as dataset_utils

    if Path(dataset_utils.__file__).with_name("Makefile").exists():
        return
    try:
        import megatron.core.datasets.helpers_cpp  # noqa: F401
    except ImportError:
        return  # neither built nor buildable here: Megatron's own error says so
    dataset_utils.compile_helpers = lambda: None


def main(argv: list[str] | None = None) -> None:
    run_dir, flush_every, rest = split_arguments(list(sys.argv[1:] if argv is None else argv))
    import torch

    if not torch.cuda.is_available():
        from workbench.megatron_lm import cpu

        cpu.install()
    keep_installed_dataset_helpers()
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
