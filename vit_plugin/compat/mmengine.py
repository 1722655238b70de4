"""Private names of mmengine that vit_plugin needs; checked against mmengine 0.10.7 and onedl-mmengine 0.10.12."""
import itertools
from typing import Any, Dict

from mmengine._strategy import DDPStrategy, SingleDeviceStrategy
from mmengine.fileio.io import _parse_uri_prefix
from mmengine.dataset import InfiniteSampler
from mmengine.runner.loops import _InfiniteDataloaderIterator
from mmengine.runner.loops import _update_losses as update_losses

from vit_plugin.compat import Inherited

__all__ = ['DDPStrategy', 'SingleDeviceStrategy', 'skip_infinite_sampler', 'LOOP_MAKES_ITERATOR_WHEN_BUILT',
           'update_losses',
           'is_local_uri', 'save_checkpoint_as_configured', 'resumes', 'accumulative_counts',
           'normalizes', 'converts_channels', 'dataset_indices',
           'AfterCheckpointSaved', 'INHERITED']

# DDPStrategy and SingleDeviceStrategy: the bases of FSDP2Strategy and XLAStrategy. mmengine keeps its
# strategies in ``mmengine._strategy`` and exports them nowhere else; the STRATEGIES registry returns
# them by name, but only at run time, and a base class is needed when the module is imported.

# update_losses: how ValLoop and TestLoop average the losses of ``val_step``/``test_step`` outputs; the
# XLA loops repeat those loops' ``run_iter`` and must keep the same log keys. ``mmengine.runner`` does
# not export it.


#: Whether mmengine's ``IterBasedTrainLoop`` makes its data iterator when the loop is built (0.10.7),
#: rather than at the first batch (onedl-mmengine 0.10.12, whose private iterator class makes it lazily
#: in ``_ensure_iterator``). Making it draws a seed from the global generator, so the two orders give
#: different weights for one seed.
LOOP_MAKES_ITERATOR_WHEN_BUILT = not hasattr(_InfiniteDataloaderIterator, '_ensure_iterator')


def skip_infinite_sampler(sampler: Any, num_samples: int) -> bool:
    """Move ``InfiniteSampler`` to sample ``num_samples`` of this rank (False for others) by the private
    ``_indices_of_rank``; mmengine 0.10.7 has no ``skip``."""
    if not isinstance(sampler, InfiniteSampler):
        return False
    if callable(getattr(sampler, 'skip', None)):
        sampler.skip(num_samples)
    else:
        sampler.indices = itertools.islice(sampler._indices_of_rank(), num_samples, None)
    return True


def is_local_uri(uri: Any) -> bool:
    """Whether ``uri`` is a local file, by ``_parse_uri_prefix`` (``get_file_backend`` honours ``backend_args``)."""
    return _parse_uri_prefix(str(uri)) == ''


class AfterCheckpointSaved:
    """Mixin (put first) adding ``after_checkpoint_saved(runner)`` to ``CheckpointHook`` through the private
    ``_save_checkpoint_with_step``, which every save goes through; no public point follows a save."""

    def _save_checkpoint_with_step(self, runner, step, meta):
        super()._save_checkpoint_with_step(runner, step, meta)
        self.after_checkpoint_saved(runner)

    def after_checkpoint_saved(self, runner) -> None:
        """Runs after each checkpoint has been written; ``self.last_ckpt`` names it."""


def save_checkpoint_as_configured(hook, runner) -> None:
    """Make ``CheckpointHook`` save now (names, rotation, ``last_checkpoint``) by ``_save_checkpoint``, the only
    step that saves without checking the interval."""
    hook._save_checkpoint(runner)


def resumes(runner) -> bool:
    """Whether the runner was told to resume (``Runner._resume``; no public property)."""
    return bool(getattr(runner, '_resume', False))


def accumulative_counts(wrapper, default: int = 1) -> int:
    """The gradient accumulation of an ``OptimWrapper`` (``_accumulative_counts``; no accessor)."""
    return getattr(wrapper, '_accumulative_counts', default)


def normalizes(preprocessor, default: bool = False) -> bool:
    """Whether an image data preprocessor normalises (``_enable_normalize``; no accessor)."""
    return bool(getattr(preprocessor, '_enable_normalize', default))


def converts_channels(preprocessor) -> bool:
    """Whether an image data preprocessor swaps BGR and RGB (``_channel_conversion``; no accessor)."""
    return bool(getattr(preprocessor, '_channel_conversion', False))


def dataset_indices(dataset) -> Any:
    """The ``indices`` argument of an mmengine ``BaseDataset`` (None when unset), kept in ``_indices``."""
    return getattr(dataset, '_indices', None)


_STRATEGY = 'mmengine._strategy.base:BaseStrategy'
_FSDP2 = 'vit_plugin.engine.fsdp2:FSDP2Strategy'
_XLA_STRATEGY = 'vit_plugin.xla.strategy:XLAStrategy'

#: Private members of mmengine classes that our subclasses override or read (see the package docstring).
INHERITED: Dict[str, Inherited] = {
    '_wrap_model': Inherited(
        'mmengine._strategy.single_device:SingleDeviceStrategy', (_FSDP2, _XLA_STRATEGY),
        'how a strategy wraps the model; the only place to put FSDP2 sharding and XLA placement'),
    '_set_randomness': Inherited(
        _STRATEGY, (_FSDP2, _XLA_STRATEGY),
        "seeds the generators; XLA seeds its device's too, FSDP2 re-seeds on a resumed seed"),
    '_randomness': Inherited(_STRATEGY, (_FSDP2,), 'the randomness settings _set_randomness was given'),
    '_seed': Inherited(_STRATEGY, (_XLA_STRATEGY,), 'the seed the strategy drew; the device seed follows it'),
    '_setup_distributed': Inherited(
        _STRATEGY, (_XLA_STRATEGY,), 'starts the process group; XLA starts its own runtime instead'),
    '_save_checkpoint_with_step': Inherited(
        'mmengine.hooks.checkpoint_hook:CheckpointHook', ('vit_plugin.compat.mmengine:AfterCheckpointSaved',),
        'the one step every CheckpointHook save goes through; AfterCheckpointSaved calls its subclass after it'),
    '_swap_ema_parameters': Inherited(
        'mmengine.hooks.ema_hook:EMAHook', ('vit_plugin.engine.hooks.sharded_ema_hook:ShardedEMAHook',),
        'swaps averaged and trained weights around validation and saving; the sharded mirror pairs them by name'),
    '_clip_grad': Inherited(
        'mmengine.optim.optimizer.optimizer_wrapper:OptimWrapper',
        ('vit_plugin.engine.optimizers.amp:AutocastOptimWrapper', 'vit_plugin.xla.optim_wrapper:XLAOptimWrapper',
         'vit_plugin.engine.optimizers.nonfinite_step:NonFiniteGuardMixin'),
        "the wrapper's clipping per clip_grad config; step() calls it, and so must a step that replaces step()"),
    '_scale_update_param': Inherited(
        'mmengine.optim.optimizer.amp_optimizer_wrapper:AmpOptimWrapper',
        ('vit_plugin.engine.optimizers.nonfinite_step:NonFiniteGuardMixin',
         'vit_plugin.engine.optimizers.amp:AutocastOptimWrapper'),
        "the fixed loss scale update() restores (None: dynamic); AutocastOptimWrapper keeps it under the same "
        'name so that the guarded AMP step serves both'),
    '_inner_count': Inherited(
        'mmengine.optim.optimizer.optimizer_wrapper:OptimWrapper', ('vit_plugin.engine.optimizers.amp:AutocastOptimWrapper',),
        'the micro-batch counter update_params advances; gradient accumulation reads it'),
    '_epoch': Inherited(
        'mmengine.runner.loops:EpochBasedTrainLoop',
        ('vit_plugin.xla.loops:XLAEpochBasedTrainLoop', 'vit_plugin.engine.loops:IterBasedTrainLoop'),
        "the loop's epoch counter, which run_epoch advances (and the iteration-based loop's __init__ sets)"),
    '_iter': Inherited(
        'mmengine.runner.loops:IterBasedTrainLoop',
        ('vit_plugin.xla.loops:XLAIterBasedTrainLoop', 'vit_plugin.xla.loops:_XLATrainMixin',
         'vit_plugin.engine.loops:IterBasedTrainLoop'),
        'the iteration counter (the loop exposes it read-only as ``iter``)'),
    '_max_iters': Inherited(
        'mmengine.runner.loops:IterBasedTrainLoop', ('vit_plugin.engine.loops:IterBasedTrainLoop',),
        "the loop's length (read-only as ``max_iters``), set by __init__, which the resuming loop repeats"),
    '_max_epochs': Inherited(
        'mmengine.runner.loops:IterBasedTrainLoop', ('vit_plugin.engine.loops:IterBasedTrainLoop',),
        'always 1 for an iteration-based loop (read-only as ``max_epochs``), set by __init__'),
    '_decide_current_val_interval': Inherited(
        'mmengine.runner.loops:IterBasedTrainLoop', ('vit_plugin.engine.loops:IterBasedTrainLoop',),
        "picks the validation interval of dynamic_intervals; run() calls it after each iteration"),
    '_metainfo': Inherited(
        'mmengine.dataset.base_dataset:BaseDataset',
        ('vit_plugin.datasets.compact_index:CompactListMixin', 'vit_plugin.datasets.shard_dataset:TarShardDataset',
         'vit_plugin.datasets.label_subset:LabelSubsetDataset'),
        "the dataset's meta information; ``metainfo`` returns a copy, and the class names known only once "
        'the data is indexed (or subset) are added to the original'),
    '_fully_initialized': Inherited(
        'mmengine.dataset.base_dataset:BaseDataset',
        ('vit_plugin.datasets.digits:DigitsDataset', 'vit_plugin.datasets.checked:_make_checked',
         'vit_plugin.datasets.indexed:IndexedRecordsMixin', 'vit_plugin.datasets.label_subset:LabelSubsetDataset',
         'vit_plugin.datasets.skip:SkipBadSamples'),
        'whether full_init ran (lazy_init): full_init returns early on it; our dataset wrappers keep '
        "the flag under the same name, as mmengine's own wrappers (ConcatDataset ...) do"),
    '_indices': Inherited(
        'mmengine.dataset.base_dataset:BaseDataset', ('vit_plugin.datasets.indexed:IndexedRecordsMixin',),
        "the dataset's ``indices`` argument, which an index-backed dataset applies itself in full_init"),
    '_serialize_data': Inherited(
        'mmengine.dataset.base_dataset:BaseDataset', ('vit_plugin.datasets.checked:_make_checked',),
        'packs data_list into arrays and fails without a word on an empty list; ours names the file first'),
}
