from __future__ import annotations

import numpy as np
import pytest

from workbench.data import SyntheticCorpus, global_batch_indices, rank_microbatch_indices


def corpus() -> SyntheticCorpus:
    return SyntheticCorpus(vocab_size=64, seq_length=16, seed=3, branching=4)


def test_samples_are_a_function_of_their_index() -> None:
    a = corpus().samples(np.array([5, 9, 2]))
    b = corpus().samples(np.array([2, 5]))
    assert a.shape == (3, 17)
    np.testing.assert_array_equal(a[0], b[1])
    np.testing.assert_array_equal(a[2], b[0])
    assert not np.array_equal(a[0], a[1])


def test_tokens_follow_the_chain() -> None:
    c = corpus()
    tokens = c.samples(np.arange(50))
    assert tokens.min() >= 0 and tokens.max() < c.vocab_size
    for row in tokens:
        for prev, nxt in zip(row[:-1], row[1:]):
            assert nxt in c.successors[prev]


def test_entropy_is_far_below_uniform() -> None:
    c = corpus()
    assert c.entropy_per_token() < 0.5 * c.uniform_loss()


@pytest.mark.parametrize(("dp", "mbs"), [(1, 8), (1, 2), (2, 2), (4, 1), (2, 4)])
def test_global_batch_is_identical_for_every_split(dp: int, mbs: int) -> None:
    gb = 8
    pieces = [mb for rank in range(dp)
              for mb in rank_microbatch_indices(3, global_batch_size=gb, micro_batch_size=mbs, dp=dp, dp_rank=rank)]
    assert all(len(p) == mbs for p in pieces)
    np.testing.assert_array_equal(np.concatenate(pieces), global_batch_indices(3, gb))
