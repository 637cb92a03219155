"""An entry script for Megatron-LM's ``pretrain()`` (megatron-core 0.19), after Megatron-LM's
``pretrain_gpt.py``, which the wheel does not ship: GPTModel with the local spec, Megatron's mock GPT
dataset, its ``get_batch_on_this_tp_rank``, forward step and loss. It runs as any entry script would, under
the workbench's launcher in the tests:

    torchrun --nproc-per-node 2 -m workbench.megatron_lm tests/integration/pretrain_gpt.py ARGS --workbench-run DIR

``WORKBENCH_TEST_FLIP=STEP:MODULE`` flips the top mantissa bit of the first element of MODULE's output at
STEP (the test's one-bit change; MODULE by its name in the model, ``decoder.layers.1.mlp``).
"""

from __future__ import annotations

import functools
import os

import torch
from megatron.core import mpu
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
from megatron.core.utils import get_batch_on_this_tp_rank
from megatron.training import get_args, pretrain, print_rank_0
from megatron.training.argument_utils import pretrain_cfg_container_from_args
from megatron.training.arguments import core_transformer_config_from_args, parse_and_validate_args


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


_BATCH_KEYS = ["tokens", "labels", "loss_mask", "attention_mask", "position_ids"]


def get_batch(data_iterator):
    args = get_args()
    batch = {}
    if mpu.get_tensor_model_parallel_rank() == 0:
        batch = next(data_iterator)
    batch = get_batch_on_this_tp_rank(
        batch,
        has_cu_seqlens=False,
        is_hybrid_cp=False,
        cp_size=1,
        mtp_on_this_rank=False,
        broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(),
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        is_pipeline_first_stage=mpu.is_pipeline_first_stage(),
        is_pipeline_last_stage=mpu.is_pipeline_last_stage(),
    )
    return [batch.get(k) for k in _BATCH_KEYS]


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


if __name__ == "__main__":
    arguments = parse_and_validate_args(args_defaults={"tokenizer_type": "NullTokenizer"})
    pretrain(pretrain_cfg_container_from_args(arguments, None), train_valid_test_datasets_provider,
             ModelType.encoder_or_decoder, forward_step, model_provider=model_provider)
