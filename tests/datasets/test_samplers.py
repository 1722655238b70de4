"""vit_plugin.BlockShuffleSampler: exact epochs on any number of processes, an order that depends only on
(seed, epoch), runs of neighbouring samples, and a skip that lands where the uninterrupted stream is."""
import itertools
import math
from collections import Counter

import numpy as np
import pytest

from vit_plugin.datasets.samplers import BlockShuffleSampler, epoch_order


@pytest.mark.parametrize('size, block, mix', [(1000, 16, 4), (1003, 16, 4), (37, 5, 3), (10, 1, 1), (7, 32, 8)])
def test_an_epoch_is_a_permutation_that_depends_only_on_seed_and_epoch(size, block, mix):
    order = epoch_order(size, seed=3, epoch=2, block_size=block, mix_blocks=mix)
    assert sorted(order.tolist()) == list(range(size))
    assert np.array_equal(order, epoch_order(size, 3, 2, block, mix))
    if size > 8:
        assert not np.array_equal(order, epoch_order(size, 3, 3, block, mix))
        assert not np.array_equal(order, epoch_order(size, 4, 2, block, mix))


def test_each_window_reads_whole_blocks_of_neighbours():
    block, mix = 16, 4
    order = epoch_order(1024, seed=0, epoch=0, block_size=block, mix_blocks=mix)
    windows = order.reshape(-1, block * mix) // block  # the block of every sample, window by window
    assert all(len(set(w.tolist())) == mix for w in windows)  # 4 blocks per window ...
    assert all(sorted(Counter(w.tolist()).values()) == [block] * mix for w in windows)  # ... each whole
    assert len({tuple(sorted(set(w.tolist()))) for w in windows}) == len(windows)
    # and the samples of a window are shuffled, not read block after block
    assert sum(np.any(np.diff(w) != 0) for w in windows[:, :block]) > 0


def test_unshuffled_is_the_index_order():
    assert epoch_order(11, 0, 5, 4, 2, shuffle=False).tolist() == list(range(11))


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_every_sample_once_per_epoch_with_at_most_world_size_minus_one_repeats(world_size):
    dataset = range(10)
    shares = [list(BlockShuffleSampler(dataset, seed=0, block_size=3, mix_blocks=2, infinite=False,
                                       rank=r, world_size=world_size)) for r in range(world_size)]
    assert len({len(s) for s in shares}) == 1  # the processes stay in step
    seen = Counter(itertools.chain(*shares))
    assert set(seen) == set(dataset)
    assert len(shares[0]) * world_size == math.ceil(len(dataset) / world_size) * world_size  # DefaultSampler's
    assert sum(seen.values()) - len(dataset) <= world_size - 1


def test_the_infinite_stream_runs_epoch_after_epoch():
    sampler = BlockShuffleSampler(range(12), seed=1, block_size=2, mix_blocks=2, rank=1, world_size=2)
    stream = list(itertools.islice(iter(sampler), 18))
    assert stream[:6] == sampler.rank_order(0).tolist() and stream[6:12] == sampler.rank_order(1).tolist()
    assert sorted(stream[:6] + BlockShuffleSampler(range(12), seed=1, block_size=2, mix_blocks=2, rank=0,
                                                   world_size=2).rank_order(0).tolist()) == list(range(12))
    assert sampler.epoch_at(13) == 2


@pytest.mark.parametrize('position', [0, 5, 6, 17, 40])
def test_skip_continues_the_uninterrupted_stream(position):
    make = lambda: BlockShuffleSampler(range(12), seed=7, block_size=3, mix_blocks=2, rank=0, world_size=2)  # noqa: E731
    full = list(itertools.islice(iter(make()), position + 10))
    resumed = make()
    resumed.skip(position)
    assert list(itertools.islice(iter(resumed), 10)) == full[position:]


def test_a_finite_sampler_skips_within_its_epoch_and_then_starts_over():
    sampler = BlockShuffleSampler(range(20), seed=2, block_size=4, infinite=False)
    sampler.set_epoch(3)
    whole = list(sampler)
    sampler.skip(7)
    assert list(sampler) == whole[7:]
    assert list(sampler) == whole  # the skip applied to one epoch
    sampler.set_epoch(4)
    assert sorted(sampler) == list(range(20)) and list(sampler) != whole


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match='block_size must be a positive int'):
        BlockShuffleSampler(range(4), seed=0, block_size=0)
    with pytest.raises(ValueError, match='infinite=True needs round_up=True'):
        BlockShuffleSampler(range(4), seed=0, round_up=False)
    with pytest.raises(ValueError, match='past the end of an epoch'):
        BlockShuffleSampler(range(4), seed=0, infinite=False).skip(5)


@pytest.mark.parametrize('world_size', [2, 3, 4])
def test_without_round_up_the_shares_split_the_epoch_order_in_rank_order(world_size):
    """round_up=False: each process takes the next contiguous part of the epoch's order, the first
    ``size % world_size`` processes one sample more, so the shares together are the order itself."""
    size = 10
    order = epoch_order(size, seed=5, epoch=1, block_size=3, mix_blocks=2).tolist()
    shares = []
    for rank in range(world_size):
        sampler = BlockShuffleSampler(range(size), seed=5, block_size=3, mix_blocks=2, infinite=False,
                                      round_up=False, rank=rank, world_size=world_size)
        sampler.set_epoch(1)
        shares.append(list(sampler))
        assert len(sampler) == len(shares[-1])
    assert sum(shares, []) == order  # no sample twice, none left out, no offset
    expected = [size // world_size + (rank < size % world_size) for rank in range(world_size)]
    assert [len(s) for s in shares] == expected


def test_round_up_pads_with_the_first_samples_of_the_epochs_order():
    """10 samples on 3 processes: the padded epoch is the order followed by its own first two samples
    (as mmengine's DefaultSampler repeats them), not by index 0 or any fixed index."""
    order = epoch_order(10, seed=4, epoch=0, block_size=2, mix_blocks=2).tolist()
    assert order[:2] != [0, 0] and 0 not in order[:2]  # the seed puts other samples first
    shares = [list(BlockShuffleSampler(range(10), seed=4, block_size=2, mix_blocks=2, infinite=False,
                                       rank=rank, world_size=3)) for rank in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]
    assert sum(shares, []) == order + order[:2]
