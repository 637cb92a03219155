"""An entry script for Megatron-LM's ``pretrain()`` (megatron-core 0.17-0.19), after Megatron-LM's
``pretrain_gpt.py``, which the wheel does not ship: GPTModel with the local spec, Megatron's mock GPT
dataset, its ``get_batch_on_this_tp_rank``, forward step and loss. It runs as any entry script would, under
the workbench's launcher in the tests:

    torchrun --nproc-per-node 2 -m workbench.megatron_lm tests/integration/pretrain_gpt.py ARGS --workbench-run DIR

``WORKBENCH_TEST_FLIP=STEP:MODULE`` flips the top mantissa bit of the first element of MODULE's output at
STEP (the test's one-bit change; MODULE by its name in the model, ``decoder.layers.1.mlp``).
"""

from __future__ import annotations

import functools
import inspect
import os

import torch
from megatron.core import mpu
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
from megatron.training import get_args, pretrain, print_rank_0
from megatron.training.arguments import core_transformer_config_from_args


def _flip_hook(model: torch.nn.Module) -> None:
    spec = os.environ.get("WORKBENCH_TEST_FLIP")
    if not spec:
        return
    step, module = spec.split(":")

    def flip(_module: torch.nn.Module, _inputs: object, output: object) -> object:
        tensor = output[0] if isinstance(output, tuple) else output
        if get_args().curr_iteration != int(step) or not isinstance(tensor, torch.Tensor):
            return None
        bit = torch.zeros_like(tensor, dtype=torch.int32).view(-1)
        bit[0] = 1 << 22
        flipped = (tensor.detach().view(torch.int32) ^ bit.view(tensor.shape)).view(tensor.dtype)
        tensor = tensor + (flipped - tensor.detach())
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

    modules = dict(model.named_modules())
    if module in modules:
        modules[module].register_forward_hook(flip)


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None,
                   pg_collection=None):
    args = get_args()
    if config is None:
        config = core_transformer_config_from_args(args)
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        vp_stage=vp_stage,
        pg_collection=pg_collection,
    )
    _flip_hook(model)
    return model


def get_batch(data_iterator):
    """The micro-batch on every TP rank: TP rank 0 reads it and broadcasts it to the others, as Megatron's
    ``get_batch_on_this_tp_rank`` does (its signature differs in each release)."""
    args = get_args()
    shape = (args.micro_batch_size, args.seq_length)
    keys = {"tokens": (torch.int64, shape), "labels": (torch.int64, shape), "loss_mask": (torch.float32, shape),
            "position_ids": (torch.int64, shape)}
    if args.create_attention_mask_in_dataloader:
        keys["attention_mask"] = (torch.bool, (args.micro_batch_size, 1, args.seq_length, args.seq_length))
    batch = next(data_iterator) if mpu.get_tensor_model_parallel_rank() == 0 else {}
    received = {}
    for key, (dtype, size) in keys.items():
        tensor = batch[key].to(dtype).contiguous() if key in batch else torch.empty(size, dtype=dtype)
        torch.distributed.broadcast(tensor, mpu.get_tensor_model_parallel_src_rank(),
                                    group=mpu.get_tensor_model_parallel_group())
        received[key] = tensor
    return [received.get(k) for k in ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")]


def loss_func(loss_mask, output_tensor):
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {'lm loss': torch.cat([loss.clone().detach().view(1),
                                                    num_tokens.view(1)])}


def forward_step(data_iterator, model):
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator)
    output_tensor = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output_tensor, functools.partial(loss_func, loss_mask)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    args = get_args()
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=None,
        blend_per_split=None,
        split=args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=build_tokenizer(args),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
    )
    print_rank_0("> building mock train, validation, and test datasets for GPT ...")
    return BlendedMegatronDatasetBuilder(
        MockGPTDataset, train_val_test_num_samples,
        lambda: mpu.get_tensor_model_parallel_rank() == 0, config,
    ).build()


train_valid_test_datasets_provider.is_distributed = True


def main() -> None:
    """``pretrain()`` in each release's signature: 0.17 ``(provider, model_provider, model_type,
    forward_step_func, ..., args_defaults)`` parses the arguments itself; 0.18 ``(cfg_container, provider,
    model_provider, model_type, forward_step_func, ...)`` and 0.19 ``(cfg_container, provider, model_type,
    forward_step_func, model_provider=None, ...)`` take them parsed, and agree on the keywords."""
    steps = {"model_provider": model_provider, "model_type": ModelType.encoder_or_decoder,
             "forward_step_func": forward_step}
    defaults = {"tokenizer_type": "NullTokenizer"}
    if "cfg_container" not in inspect.signature(pretrain).parameters:
        pretrain(train_valid_test_datasets_provider, args_defaults=defaults, **steps)
        return
    from megatron.training.argument_utils import pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    arguments = parse_and_validate_args(args_defaults=defaults)
    pretrain(pretrain_cfg_container_from_args(arguments, None), train_valid_test_datasets_provider, **steps)


if __name__ == "__main__":
    main()
