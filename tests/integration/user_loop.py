"""A researcher's own Megatron Core training loop, recorded with ``workbench.recorder.record``.

Written the way Megatron-LM's ``examples/run_simple_mcore_train_loop.py`` writes one: its own
``TransformerConfig`` and ``GPTModel`` (local spec), Megatron DDP, ``get_forward_backward_func``,
``finalize_model_grads`` called directly, a plain ``torch.optim.Adam``. Nothing from the
workbench but the recording lines (the "Record your own training" snippet of the README and of
docs/record-your-training.md, whose lines the test finds here in order) and, on a machine without a GPU, ``cpu_compat``.

    python -m torch.distributed.run --nproc-per-node 2 tests/integration/user_loop.py RUN_DIR --tp 2

``--model hybrid`` trains megatron-core's ``HybridModel`` instead (0.18+), pattern ``"*-*-"`` of
``workbench.recorder.hybrid_local_spec()``: the same two blocks as the GPTModel, as four Megatron
layers (attention, MLP, attention, MLP), with ``is_hybrid_model`` (whose output-layer init is then
GPTModel's for the same blocks, so the two models start equal).

``--flip STEP:MODULE`` flips the top mantissa bit of one element of MODULE's output at STEP
(the test's own forward hook; the lowest bit could vanish in the residual add, depending on
the values, which depend on the CPU); ``--raise-at STEP`` makes the loop fail there.

``--megatron-dumps SAVE`` also writes Megatron-LM's own tensor dumps under SAVE every step, by
``megatron.training``'s functions called as ``train_step`` calls them (activations and dgrads hooked
around the forward-backward, wgrads after the gradients' reduction, params after the optimizer step;
megatron-core 0.17+); ``--micro-batches`` sets their number (a dump keeps the last one).

``--ddp FIELD`` turns on a switch of Megatron DDP's ``DistributedDataParallelConfig`` (repeatable):
``overlap_grad_reduce``, ``use_distributed_optimizer``. ``--kinds KIND,...`` records those site kinds.

``--optimizer megatron`` trains with Megatron's own optimizer (``get_megatron_optimizer``: Adam, gradient clipping
at 1.0, the distributed optimizer when ``--ddp use_distributed_optimizer``), on the CPU through ``cpu_compat``;
``--bucket-size N`` sets Megatron DDP's bucket size (small buckets: a distributed optimizer's shards split
parameters mid-row). ``--expect FILE`` makes rank 0 save, at every step, the full tensors the recorder's
``param``, ``grad`` and ``update`` sites must match, taken by the loop itself: the parameters as the first forward
used them (gathered by then, under ``overlap_param_gather`` too), the fully reduced gradients (each bucket's
reduced shards gathered from every data-parallel rank, by Megatron DDP's own even split of the bucket) and the
updated parameters (gathered likewise) minus those.

The bug-or-rounding corpus (tests/integration/test_bug_or_rounding.py, benchmarks/rounding_corpus.py): ``--sp``
trains with sequence parallelism (the runner's norm that takes it, where Transformer Engine's would);
``--perturb PRECISION`` makes a band run (``record(..., perturb=...)``); ``--emulate SOURCE,...`` puts on the
CPU emulations of GPU nondeterminism (``record(..., emulate=[...])``); ``--bug NAME`` injects one of ``BUGS`` (the
runner's layout bugs, by the runner's own function, and two of the loop's own).

``--against REF`` records with a live reference (``record(..., against=REF)``, flushing every
``--flush-every`` steps, ``--keep-going``); a ``RunDiverged`` ends the process with exit code 3 and the
departure on stdout, on every rank.
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

from workbench.config import LAYOUT_BUGS, RecordConfig
from workbench.errors import RunDiverged
from workbench.recorder import record
from workbench.runner import cpu_compat
from workbench.runner.faults import inject_layout_bug

SEQ, VOCAB, MICRO_BATCH = 16, 128, 2


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--model", choices=("gpt", "hybrid"), default="gpt")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--flip", default=None, help="STEP:MODULE")
    parser.add_argument("--raise-at", type=int, default=None)
    parser.add_argument("--eval-every", type=int, default=2,
                        help="a held-out loss (the batches of 'step -1', which no step trains on); 0: none")
    parser.add_argument("--no-optimizer", action="store_true", help="do not hand the optimizer to record()")
    parser.add_argument("--against", default=None, help="a live reference: a run folder or a golden file")
    parser.add_argument("--flush-every", type=int, default=10)
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--megatron-dumps", default=None, help="SAVE: Megatron-LM's tensor dumps, every step")
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--kinds", default=None, help="KIND,KIND,...: the site kinds to record, if not the default")
    parser.add_argument("--optimizer", choices=("torch", "megatron"), default="torch")
    parser.add_argument("--bucket-size", type=int, default=None)
    parser.add_argument("--expect", default=None, help="FILE: the full tensors each step's sites must match")
    parser.add_argument("--sp", action="store_true", help="sequence parallelism (with --tp > 1)")
    parser.add_argument("--perturb", default=None, help="PRECISION: a band run (record(..., perturb=PRECISION))")
    parser.add_argument("--emulate", default=None, help="SOURCE,...: record(..., emulate=[...]) (CPU nondeterminism)")
    parser.add_argument("--bug", choices=tuple(BUGS), default=None, help="a layout bug of the corpus, injected")
    parser.add_argument("--ddp", action="append", default=[], metavar="FIELD",
                        help="a DistributedDataParallelConfig switch to turn on (overlap_grad_reduce, ...)")
    return parser.parse_args()


class MegatronDumps:
    """Megatron-LM's dumps of one step, written by its own functions in the order ``train_step`` writes them.

    Two of Megatron's own bugs are routed around first. Without Transformer Engine, megatron-core 0.19's
    ``LINEAR_TYPES`` hold TE placeholders that are not classes, so ``isinstance`` raises ``TypeError:
    isinstance() arg 2 must be a type``: they are filtered out. With fp32 logits, the vocab-parallel cross
    entropy subtracts the maximum from the logits in place (its ``.float()`` copies only other dtypes), which
    autograd forbids on the output of a module with a full backward hook (the dgrads' hook on
    ``output_layer``): it is handed a copy of the same values."""

    def __init__(self, save: str, model: torch.nn.Module) -> None:
        from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy
        from megatron.training import activation_logging, dgrad_logging

        for module in (activation_logging, dgrad_logging):
            module.LINEAR_TYPES = tuple(t for t in module.LINEAR_TYPES if isinstance(t, type))
        in_place = VocabParallelCrossEntropy.calculate_logits_max
        VocabParallelCrossEntropy.calculate_logits_max = staticmethod(  # type: ignore[method-assign]
            lambda logits: in_place(logits.clone() if logits.dtype == torch.float32 else logits))
        self.save, self.model = save, model
        self.activations, self.dgrads = activation_logging, dgrad_logging

    def before_forward(self) -> None:
        self.activations.enable_activation_logging([self.model], self.save)
        self.dgrads.enable_dgrad_logging([self.model], self.save)

    def after_backward(self, step: int) -> None:
        self.activations.save_activations(step + 1)
        self.activations.disable_activation_logging()
        self.dgrads.save_dgrads(step + 1)
        self.dgrads.disable_dgrad_logging()

    def tensors(self, attribute: str, label: str, step: int) -> None:
        """``train_step``'s ``_save_state_dict``: every parameter's ``attribute`` (main_grad, data)."""
        from collections import defaultdict

        from megatron.core.utils import unwrap_model
        from megatron.training.checkpointing import save_grads

        state: defaultdict[str, dict[str, torch.Tensor]] = defaultdict(dict)
        for name, param in unwrap_model(self.model).named_parameters():
            if getattr(param, attribute, None) is not None:
                state["model_chunk0"][name] = getattr(param, attribute).cpu()
        save_grads(self.save, state, step + 1, label)


class Expected:
    """The full tensors of ``--expect``, taken by the loop itself (rank 0 saves them)."""

    def __init__(self, path: str, model: DistributedDataParallel, lm: torch.nn.Module) -> None:
        from workbench.recorder.targets import site_names

        self.path, self.model = path, model
        names = site_names(lm)
        self.params = [(names(name), param) for name, param in lm.named_parameters()]
        self.steps: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
        self.step = -1
        lm.register_forward_hook(self._forward_done)

    def _forward_done(self, module: torch.nn.Module, args: object, output: object) -> None:
        if self.step >= 0 and "param" not in self.steps.setdefault(self.step, {}):  # the step's first forward
            self.steps[self.step]["param"] = {name: param.detach().clone() for name, param in self.params}

    def _gathered(self, attribute: str) -> dict[str, torch.Tensor]:
        """Each parameter's full ``main_grad`` or ``data``: under the distributed optimizer each bucket's shards
        (Megatron DDP's even split) gathered from every data-parallel rank, else the rank's own."""
        ddp = self.model.ddp_config
        full: dict[int, torch.Tensor] = {}
        if ddp.use_distributed_optimizer:
            group = parallel_state.get_data_parallel_group()
            size, rank = dist.get_world_size(group), dist.get_rank(group)
            for buffer in self.model.buffers + self.model.expert_parallel_buffers:
                for bucket in buffer.buckets:
                    data = bucket.grad_data if attribute == "main_grad" else bucket.param_data
                    gathered = torch.empty_like(data)
                    dist.all_gather_into_tensor(gathered, data.view(size, -1)[rank].contiguous(), group=group)
                    for param in bucket.params:
                        tensor = getattr(param, attribute)
                        start = (tensor.data_ptr() - data.data_ptr()) // tensor.element_size()
                        full[id(param)] = gathered[start:start + tensor.numel()].view(tensor.shape).clone()
        return {name: full.get(id(param), getattr(param, attribute).detach()).clone() for name, param in self.params}

    def gradients(self) -> None:
        self.steps[self.step]["grad"] = self._gathered("main_grad")

    def updated(self) -> None:
        after = self._gathered("data")
        before = self.steps[self.step]["param"]
        self.steps[self.step]["update"] = {name: after[name].float() - before[name].float() for name in after}

    def save(self) -> None:
        if dist.get_rank() == 0:
            torch.save(self.steps, self.path)


BUGS = {
    **LAYOUT_BUGS,  # the runner's layout bugs (fault.kind = "layout_bug"), injected by the same function
    "loss_scaled_twice": "the loss function divides by the micro-batch count that the schedule divides by already",
    "attention_scale": "layer 0's attention on TP rank 1 scales its scores by 1 + 2**-9 more (a softmax scale taken "
                       "from another head count)",
}
"""The layout bugs of the corpus (``--bug``), each of a kind Megatron-LM has had."""


def inject(bug: str | None, lm: torch.nn.Module) -> None:
    """Put ``bug`` (``BUGS``) into the model before training; the loss's bug is the loss function's."""
    if bug in LAYOUT_BUGS:
        inject_layout_bug(bug, lm)
    if bug == "attention_scale" and parallel_state.get_tensor_model_parallel_rank() == 1:
        dict(lm.named_modules())["decoder.layers.0.self_attention.core_attention"].softmax_scale *= 1 + 2.0 ** -9


def batches(step: int, rank_seed: int, count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rank_seed * 1000 + step)
    return [torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=generator) for _ in range(count)]


def record_without_optimizer(run_dir, chunks, optimizer, **options):  # type: ignore[no-untyped-def]
    """``record`` not told the optimizer (``--no-optimizer``: the test of kinds never seen)."""
    return record_with_optimizer(run_dir, chunks, None, **options)


def record_against(run_dir, chunks, optimizer, **options):  # type: ignore[no-untyped-def]
    """``record`` with a live reference (``--against``, ``--flush-every``, ``--keep-going``)."""
    args = parse()
    return record_with_optimizer(run_dir, chunks, optimizer, against=args.against, flush_every=args.flush_every,
                                 keep_going=args.keep_going, **options)


record_with_optimizer = record


def main() -> None:
    global record
    args = parse()
    if args.kinds:  # the README's record(...) line stays as it is; the kinds ride with the function
        record = functools.partial(record, record=RecordConfig(kinds=tuple(args.kinds.split(","))))
    if args.perturb:
        record = functools.partial(record, perturb=args.perturb)
    if args.emulate:
        record = functools.partial(record, emulate=args.emulate.split(","))
    cpu_compat.install_if_needed()
    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(args.tp, args.pp)
    model_parallel_cuda_manual_seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    hybrid = args.model == "hybrid"
    config = TransformerConfig(
        num_layers=4 if hybrid else 2, is_hybrid_model=hybrid, hidden_size=32, num_attention_heads=4,
        use_cpu_initialization=True, pipeline_dtype=torch.float32, tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp, sequence_parallel=args.sp,
        hidden_dropout=0.0, attention_dropout=0.0, gradient_accumulation_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        deterministic_mode=True)
    stages = {"pre_process": parallel_state.is_pipeline_first_stage(),
              "post_process": parallel_state.is_pipeline_last_stage()}
    if hybrid:
        from megatron.core.models.hybrid.hybrid_model import HybridModel

        from workbench.recorder import hybrid_local_spec

        lm = HybridModel(config=config, hybrid_stack_spec=hybrid_local_spec(), vocab_size=VOCAB,
                         max_sequence_length=SEQ, hybrid_layer_pattern="*-*-",
                         position_embedding_type="learned_absolute", **stages)
    else:
        spec = get_gpt_layer_local_spec()
        if args.sp:  # torch's norms refuse sequence parallelism; on a GPU, Transformer Engine's norms take it
            import dataclasses

            from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

            from workbench.runner.model import SequenceParallelNorm

            spec = TransformerBlockSubmodules(layer_specs=[dataclasses.replace(spec, submodules=dataclasses.replace(
                spec.submodules, input_layernorm=SequenceParallelNorm, pre_mlp_layernorm=SequenceParallelNorm))] *
                config.num_layers, layer_norm=SequenceParallelNorm)
        lm = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ, **stages)
    inject(args.bug, lm)
    ddp_config = DistributedDataParallelConfig(**dict.fromkeys(args.ddp, True), bucket_size=args.bucket_size)
    model = DistributedDataParallel(config=config, module=lm, ddp_config=ddp_config)
    if args.optimizer == "megatron":
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        optimizer = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=1e-3, clip_grad=1.0, use_distributed_optimizer=ddp_config.use_distributed_optimizer),
            [model])
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    expected = Expected(args.expect, model, lm) if args.expect else None
    forward_backward_func = get_forward_backward_func()
    position_ids = torch.arange(SEQ)[None].expand(MICRO_BATCH, SEQ)
    attention_mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)[None, None]

    current_step = [0]
    if args.flip:
        flip_step, flip_module = args.flip.split(":")

        def flip(module: torch.nn.Module, inputs: object, output: object) -> object:
            tensor = output[0] if isinstance(output, tuple) else output
            if current_step[0] != int(flip_step) or not isinstance(tensor, torch.Tensor):
                return None
            bit = torch.zeros_like(tensor, dtype=torch.int32).view(-1)
            bit[0] = 1 << 22  # the top mantissa bit of the first element: the value moves by half or more
            flipped = (tensor.detach().view(torch.int32) ^ bit.view(tensor.shape)).view(tensor.dtype)
            tensor = tensor + (flipped - tensor.detach())  # the flipped value, the gradient unchanged
            return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

        dict(lm.named_modules())[flip_module].register_forward_hook(flip)

    def forward_step(data_iterator, model):  # type: ignore[no-untyped-def]
        tokens = next(data_iterator)
        output = model(tokens[:, :-1], position_ids, attention_mask, labels=tokens[:, 1:])

        def loss_func(output_tensor):  # type: ignore[no-untyped-def]
            loss = output_tensor.float().mean()
            if args.bug == "loss_scaled_twice":
                return loss / args.micro_batches, {"lm loss": loss}
            return loss, {"lm loss": loss}

        return output, loss_func

    MICRO_BATCHES = args.micro_batches  # noqa: N806 (the README snippet's name)
    run_dir, steps, global_batch_size = args.run_dir, args.steps, MICRO_BATCH * MICRO_BATCHES
    dumps = MegatronDumps(args.megatron_dumps, model) if args.megatron_dumps else None
    EVAL_EVERY = args.eval_every or steps + 1  # noqa: N806 (the README snippet's name)
    with record(run_dir, [model], optimizer, steps=steps, global_batch_size=global_batch_size, seed=args.seed,
                user_config=vars(args)) as run:
        for step in range(steps):
            with run.step(step):
                current_step[0] = step
                if expected:
                    expected.step = step
                if step == args.raise_at:
                    raise RuntimeError(f"the loop failed at step {step}")
                model.zero_grad_buffer()
                optimizer.zero_grad()
                if dumps:
                    dumps.before_forward()
                losses = forward_backward_func(
                    forward_step_func=forward_step, data_iterator=iter(batches(step, args.seed, MICRO_BATCHES)),
                    model=[model], num_microbatches=MICRO_BATCHES, seq_length=SEQ, micro_batch_size=MICRO_BATCH,
                    forward_only=False)
                if dumps:
                    dumps.after_backward(step)
                finalize_model_grads([model])
                if dumps:
                    dumps.tensors("main_grad", "wgrads", step)
                if expected:
                    expected.gradients()
                if args.optimizer == "torch":
                    for p in model.parameters():
                        p.grad = p.main_grad
                optimizer.step()
                if expected:
                    expected.updated()
                    expected.step = -1  # the held-out loss's forward is not the step's
                if dumps:
                    dumps.tensors("data", "params", step)
                loss = sum(float(x["lm loss"]) for x in losses) / MICRO_BATCHES if losses else None
                run.log(loss=loss, lr=optimizer.param_groups[0]["lr"])
                if step % EVAL_EVERY == EVAL_EVERY - 1:
                    with run.evaluating(), torch.no_grad():
                        held_out = forward_backward_func(
                            forward_step_func=forward_step, data_iterator=iter(batches(-1, args.seed, MICRO_BATCHES)),
                            model=[model], num_microbatches=MICRO_BATCHES, seq_length=SEQ,
                            micro_batch_size=MICRO_BATCH, forward_only=True)
                    run.log(val_loss=sum(float(x["lm loss"]) for x in held_out) / MICRO_BATCHES if held_out else None)
    if expected:
        expected.save()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "--no-optimizer" in sys.argv:
        record = record_without_optimizer
    if "--against" in sys.argv:
        record = record_against
    try:
        main()
    except RunDiverged as stop:  # on every rank, at the same step
        print(f"DIVERGED {stop.departure.step} {stop.departure.site}", flush=True)
        sys.exit(3)
