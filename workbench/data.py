"""The synthetic corpus: a sparse Markov chain over the vocabulary, made by the project.

Each token has ``branching`` possible successors with Zipf-like probabilities, so the
model has real structure to learn (its best loss is the chain's conditional entropy,
far below ln(vocab)) and no data is downloaded. Sample ``i`` is a pure function of
``(data.seed, i)``: any rank can make any sample, and the global batch of a step (its
samples and their order) is the same whatever the TP/PP/DP layout and micro-batch split.

    corpus = SyntheticCorpus(vocab_size=256, seq_length=64, seed=0, branching=4)
    tokens = corpus.samples(np.arange(16))          # [16, 65] int64
    held_out = corpus.samples(held_out_indices(16))  # for the validation loss; no training step uses them
"""

from __future__ import annotations

import math

import numpy as np


class SyntheticCorpus:
    def __init__(self, *, vocab_size: int, seq_length: int, seed: int, branching: int) -> None:
        self.vocab_size = vocab_size
        self.seq_length = seq_length
        self.seed = seed
        rng = np.random.default_rng([seed, 0x5EED])
        k = min(branching, vocab_size)
        weights = 1.0 / np.arange(1, k + 1)
        self.probs = weights / weights.sum()  # [k], shared by every token
        # successors[v] lists the k tokens that may follow token v (distinct, random).
        self.successors = np.stack([rng.choice(vocab_size, size=k, replace=False) for _ in range(vocab_size)])
        self._cumulative = np.cumsum(self.probs)  # [k]

    def entropy_per_token(self) -> float:
        """Conditional entropy of the chain in nats: the lowest loss a model can reach."""
        return float(-(self.probs * np.log(self.probs)).sum())

    def uniform_loss(self) -> float:
        """Loss of a model that has learned nothing: ln(vocab)."""
        return math.log(self.vocab_size)

    def samples(self, indices: np.ndarray) -> np.ndarray:
        """Token sequences [len(indices), seq_length + 1] (inputs and shifted labels)."""
        indices = np.asarray(indices, dtype=np.int64)
        n, length = len(indices), self.seq_length + 1
        draws = np.empty((n, length), dtype=np.float64)
        for row, index in enumerate(indices):
            draws[row] = np.random.default_rng([self.seed, int(index)]).random(length)
        tokens = np.empty((n, length), dtype=np.int64)
        tokens[:, 0] = (draws[:, 0] * self.vocab_size).astype(np.int64)
        choice = np.searchsorted(self._cumulative, draws[:, 1:], side="right").clip(max=len(self.probs) - 1)
        for t in range(1, length):
            tokens[:, t] = self.successors[tokens[:, t - 1], choice[:, t - 1]]
        return tokens


HELD_OUT_START = 2**48
"""Sample indices from here on are held out: no training step reaches them (2**48 samples)."""


def held_out_indices(samples: int) -> np.ndarray:
    """The held-out samples a validation loss is computed on, the same ones at every evaluation."""
    return np.arange(HELD_OUT_START, HELD_OUT_START + samples, dtype=np.int64)


def rank_held_out_microbatches(samples: int, *, micro_batch_size: int, dp: int, dp_rank: int) -> list[np.ndarray]:
    """One data-parallel rank's micro-batches of the held-out samples (split as a training batch is)."""
    return list(held_out_indices(samples).reshape(dp, -1)[dp_rank].reshape(-1, micro_batch_size))


def global_batch_indices(step: int, global_batch_size: int) -> np.ndarray:
    """Sample indices of one step's global batch, in order."""
    start = step * global_batch_size
    return np.arange(start, start + global_batch_size, dtype=np.int64)


def rank_microbatch_indices(step: int, *, global_batch_size: int, micro_batch_size: int, dp: int,
                            dp_rank: int) -> list[np.ndarray]:
    """The micro-batches (sample indices) one data-parallel rank trains on at ``step``.

    The global batch is split into ``dp`` contiguous shares, each share into micro-batches
    in order; concatenated over ranks and micro-batches they give the global batch back.
    """
    batch = global_batch_indices(step, global_batch_size)
    share = batch.reshape(dp, -1)[dp_rank]
    return list(share.reshape(-1, micro_batch_size))
