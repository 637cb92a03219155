"""The Megatron Core runner (torch and megatron-core): worker loop, launcher, checkpoints."""
