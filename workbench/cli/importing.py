"""The verbs that turn other tools' files into run stores: ``import-te``, ``import-megatron``,
``import-megatron-dumps``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from workbench.cli._common import whole, writable_dir


def register(verbs: argparse._SubParsersAction) -> None:
    for add in (_add_import_te, _add_import_megatron, _add_import_megatron_dumps):
        add(verbs)


def _add_import_te(verbs: argparse._SubParsersAction) -> None:
    te = verbs.add_parser("import-te", help="import Transformer Engine debug statistics logs into a run store")
    te.add_argument("logs", type=Path, nargs="+", help="log files, or their nvdlfw_inspect_statistics_logs folder")
    te.add_argument("--out", type=writable_dir, required=True, help="the run folder to create")
    te.add_argument("--name", default=None, help="run name (default: the folder's name)")
    te.set_defaults(func=_import_te)


def _import_te(args: argparse.Namespace) -> int:
    from workbench.importers import import_te_log

    start = time.monotonic()
    run_dir = import_te_log(args.logs, args.out, name=args.name or args.out.resolve().name)
    print(f"imported {len(args.logs)} path(s) into {run_dir} in {time.monotonic() - start:.1f} s; "
          f"compare it with another import: workbench compare {run_dir} OTHER")
    return 0


def _add_import_megatron(verbs: argparse._SubParsersAction) -> None:
    mtb = verbs.add_parser("import-megatron", help="import Megatron-LM's TensorBoard scalars (lm loss, grad-norm, "
                           "...) as a run")
    mtb.add_argument("logdir", type=Path, help="the folder of events.out.tfevents.* files (--tensorboard-dir)")
    mtb.add_argument("--out", type=writable_dir, required=True, help="the run folder to create")
    mtb.add_argument("--name", default=None, help="run name (default: the folder's name)")
    mtb.add_argument("--tokens-per-step", type=whole(1), default=None,
                     help="global batch x sequence length, for tokens/s")
    mtb.set_defaults(func=_import_megatron)


def _import_megatron(args: argparse.Namespace) -> int:
    from workbench.importers.megatron_tb import import_megatron_tensorboard

    run_dir = import_megatron_tensorboard(args.logdir, args.out, name=args.name or args.out.resolve().name,
                                          tokens_per_step=args.tokens_per_step)
    print(f"imported {args.logdir} into {run_dir}")
    return 0


def _add_import_megatron_dumps(verbs: argparse._SubParsersAction) -> None:
    dumps = verbs.add_parser("import-megatron-dumps", help="import Megatron-LM's tensor dumps (--save-activations-"
                             "interval, --save-dgrads-interval, --save-wgrads-interval, --save-params-interval) as "
                             "a run whose sites line up with a recorded run's")
    dumps.add_argument("save_dir", type=Path, help="Megatron-LM's --save folder (or one of its activations/, "
                       "dgrads/, wgrads/, params/ folders)")
    dumps.add_argument("--out", type=writable_dir, required=True, help="the run folder to create")
    dumps.add_argument("--name", default=None, help="run name (default: the folder's name)")
    dumps.add_argument("--ep", type=whole(1), default=None,
                       help="the expert-parallel size, where file names carry one rank suffix and it is the "
                       "expert rank (default: a single suffix is the pipeline rank)")
    dumps.add_argument("--sequence-parallel", action="store_true",
                       help="the run used sequence parallelism (its activations are split along the sequence)")
    dumps.add_argument("--precision", choices=("fp32", "bf16", "fp16", "fp8"), default=None,
                       help="the run's precision, for the underflow and overflow counts (default: the dtype of "
                       "the parameters or activations)")
    dumps.add_argument("--router-traces", type=Path, default=None, metavar="DIR",
                       help="also read Megatron's MoE router traces from DIR (--moe-routing-trace-path)")
    dumps.add_argument("--experts", type=whole(1), default=None,
                       help="the number of experts the router traces route to (default: the largest index + 1)")
    dumps.add_argument("--tp", type=whole(1), default=None,
                       help="the tensor-parallel size, where no dump file tells it (router traces alone)")
    dumps.add_argument("--pp", type=whole(1), default=None,
                       help="the pipeline-parallel size, where no dump file tells it (router traces alone)")
    dumps.set_defaults(func=_import_megatron_dumps)


def _import_megatron_dumps(args: argparse.Namespace) -> int:
    from workbench.megatron_lm.dumps import import_megatron_dumps

    start = time.monotonic()
    run_dir = import_megatron_dumps(args.save_dir, args.out, name=args.name or args.out.resolve().name, ep=args.ep,
                                    sequence_parallel=args.sequence_parallel, precision=args.precision,
                                    router_traces=args.router_traces, experts=args.experts, tp=args.tp, pp=args.pp)
    print(f"imported {args.save_dir} into {run_dir} in {time.monotonic() - start:.1f} s; compare it with "
          f"another import or a recorded run: workbench compare {run_dir} OTHER")
    return 0
