"""``vit_plugin.BlockShuffleSampler``: exact epochs, near-sequential reads, and resume without reading.

mmengine's ``InfiniteSampler`` shuffles all indices: fine for files on a local disk, but a tar shard
read in random order costs one seek (or one remote request) per image, and a resumed run must replay
the stream. timm's WebDataset reader reads shards in order but its epochs are approximate (each worker
stops after ``ceil(N / workers)`` samples, so samples repeat or go missing) and it resumes only at an
epoch's start. This sampler gives:

* **Exact epochs.** Every sample once per epoch. The epoch's order is padded to a multiple of the number
  of processes by repeating its first samples, as mmengine's ``DefaultSampler`` does (at most
  ``world_size - 1`` repeats), and each process takes a contiguous share of it.
* **An order that is a pure function of (seed, epoch)** (:func:`epoch_order`), the same for any number
  of data-loader workers (the sampler runs in the training process; workers only load).
* **Near-sequential reads.** The dataset's index order (shard by shard, each in tar order) is cut into
  blocks of ``block_size`` consecutive samples; the blocks are shuffled, then the samples of every
  ``mix_blocks`` consecutive blocks of that order are shuffled together. A window of
  ``block_size * mix_blocks`` samples draws from ``mix_blocks`` places in the data, each read in runs
  of ``block_size`` neighbours: large blocks for shards written in random order (timm's), small ones
  for data sorted by class (a tar of per-synset tars, a list file), so that a batch still mixes classes.
* **Instant resume.** :meth:`skip` jumps to an absolute position of this process's stream (mmengine's
  ``InfiniteSampler.skip`` contract): ``vit_plugin.IterBasedTrainLoop`` (and onedl-mmengine's loop)
  call it with ``iterations x batch_size`` so a resumed run continues at the next unseen sample
  without loading any skipped batch. It works for every map-style dataset, list files included.

docs/data.md#sampling has the choice of ``block_size`` and ``mix_blocks``.
"""
import math
from typing import Iterator, Optional, Sized

import numpy as np
from mmengine.dist import get_dist_info, sync_random_seed
from torch.utils.data import Sampler

from vit_plugin.registry import DATA_SAMPLERS

_YIELD_CHUNK = 1 << 16  # indices turned into Python ints at a time


def epoch_order(size: int, seed: int, epoch: int, block_size: int = 1, mix_blocks: int = 1,
                shuffle: bool = True) -> np.ndarray:
    """The order of ``range(size)`` for one epoch: blocks of ``block_size`` consecutive indices in a
    random order, the indices of every ``mix_blocks`` consecutive blocks (in that order) shuffled together.

    A pure function of its arguments (numpy's PCG64 seeded with ``(seed, epoch)``); ``block_size=1``
    and ``mix_blocks=1`` is a plain random permutation.

    Returns:
        np.ndarray: int64 indices, a permutation of ``range(size)``.
    """
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) % (1 << 63), int(epoch)])))
    num_blocks = -(-size // block_size)
    starts = rng.permutation(num_blocks).astype(np.int64) * block_size
    lengths = np.minimum(block_size, size - starts)
    before = np.cumsum(lengths) - lengths  # where each block begins in the new order
    order = np.repeat(starts - before, lengths) + np.arange(size, dtype=np.int64)
    if block_size * mix_blocks <= 1:
        return order
    # Windows of mix_blocks blocks: all have block_size * mix_blocks indices except the one holding the
    # last (short) block and the last window; shuffle the full ones in one call, the others one by one.
    bounds = np.append(before[::mix_blocks], size)
    window = block_size * mix_blocks
    lengths = np.diff(bounds)
    full = bounds[:-1][lengths == window]
    if len(full):
        rows = full[:, None] + np.arange(window)
        order[rows] = rng.permuted(order[rows], axis=1)
    for start, length in zip(bounds[:-1][lengths != window], lengths[lengths != window]):
        rng.shuffle(order[start:start + length])
    return order


@DATA_SAMPLERS.register_module()
class BlockShuffleSampler(Sampler):
    """Exact epochs in blocks of neighbouring samples, for any number of processes; resumes by skipping.

    See the module docstring. Build it as mmengine builds samplers:
    ``sampler=dict(type='vit_plugin.BlockShuffleSampler', block_size=256, mix_blocks=16)``.

    Args:
        dataset (Sized): The dataset (only its length is used).
        shuffle (bool): Shuffle blocks and samples; False gives the index order. Defaults to True.
        seed (int, optional): The order's seed; None: a random seed shared by all processes (as
            mmengine's samplers). Defaults to None.
        block_size (int): Consecutive samples read together. Defaults to 256.
        mix_blocks (int): Blocks whose samples are shuffled together. Defaults to 16.
        infinite (bool): One epoch after another, forever (for ``IterBasedTrainLoop``: batches run across
            epoch ends); False: one epoch per ``iter()``, chosen by :meth:`set_epoch`
            (``EpochBasedTrainLoop``). Defaults to True.
        round_up (bool): Pad each epoch to a multiple of the number of processes (the processes then
            stay in step); False (finite epochs only) gives some processes one sample less.
            Defaults to True.
        rank (int, optional): This process's rank; default from the process group.
        world_size (int, optional): The number of processes; default from the process group.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: Optional[int] = None, block_size: int = 256,
                 mix_blocks: int = 16, infinite: bool = True, round_up: bool = True, *,
                 rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
        for name, value in (('block_size', block_size), ('mix_blocks', mix_blocks)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'BlockShuffleSampler: {name} must be a positive int, got {value!r}')
        if infinite and not round_up:
            raise ValueError('BlockShuffleSampler: infinite=True needs round_up=True, or the processes would '
                             'drift apart by a sample every epoch')
        default_rank, default_world = get_dist_info()
        self.rank = default_rank if rank is None else int(rank)
        self.world_size = default_world if world_size is None else int(world_size)
        self.dataset = dataset
        self.size = len(dataset)
        if self.size == 0:
            raise ValueError('BlockShuffleSampler: the dataset is empty')
        self.shuffle, self.block_size, self.mix_blocks = shuffle, block_size, mix_blocks
        self.seed = sync_random_seed() if seed is None else int(seed)
        self.infinite, self.round_up = infinite, round_up
        if round_up:
            self.num_samples = math.ceil(self.size / self.world_size)  # per process and epoch
        else:
            self.num_samples = max(0, math.ceil((self.size - self.rank) / self.world_size))
        self.epoch = 0
        self._start = 0  # the position :meth:`skip` set

    def rank_order(self, epoch: int) -> np.ndarray:
        """This process's share of epoch ``epoch``: a contiguous part of the padded epoch order."""
        order = epoch_order(self.size, self.seed, epoch, self.block_size, self.mix_blocks, self.shuffle)
        if self.round_up:
            total = self.num_samples * self.world_size
            if total > self.size:  # repeat the first samples, as DefaultSampler does
                order = np.resize(order, total)
            return order[self.rank * self.num_samples:(self.rank + 1) * self.num_samples]
        per = self.size // self.world_size
        extra = self.size % self.world_size
        begin = self.rank * per + min(self.rank, extra)
        return order[begin:begin + self.num_samples]

    def __iter__(self) -> Iterator[int]:
        if self.infinite:
            epoch, offset = divmod(self._start, self.num_samples)
        else:
            epoch, offset, self._start = self.epoch, self._start, 0  # a skip applies to one epoch
        while True:
            order = self.rank_order(epoch)
            for begin in range(offset, len(order), _YIELD_CHUNK):
                yield from order[begin:begin + _YIELD_CHUNK].tolist()
            if not self.infinite:
                return
            epoch, offset = epoch + 1, 0

    def skip(self, num_samples: int) -> None:
        """Start the next iteration at position ``num_samples`` of this process's stream: counted from the
        start of training for an infinite sampler (epochs included), from the start of the epoch for a
        finite one. Nothing is loaded: the order is recomputed from (seed, epoch)."""
        if not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f'skip: num_samples must be an int >= 0, got {num_samples!r}')
        if not self.infinite and num_samples > self.num_samples:
            raise ValueError(f'skip: {num_samples} samples is past the end of an epoch of {self.num_samples}')
        self._start = num_samples

    def epoch_at(self, num_samples: int) -> int:
        """The data epoch that position ``num_samples`` of an infinite stream lies in."""
        return num_samples // self.num_samples

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next ``iter()`` (finite sampler; an infinite one counts its own epochs)."""
        self.epoch = epoch


__all__ = ['BlockShuffleSampler', 'epoch_order']
