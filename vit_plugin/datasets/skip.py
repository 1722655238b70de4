"""A counted skip policy for bad training samples: replace, log, count, stop past a limit.

Off by default: without it, the first unreadable image stops training with an error naming the file
(:class:`~vit_plugin.datasets.decode.ImageDecodeError`). A multi-day run over millions of web images
may rather go on past a handful of broken files, as long as nothing is silent. Wrap the training
dataset::

    train_dataloader = dict(dataset=dict(type='vit_plugin.SkipBadSamples', max_fraction=1e-4,
                                         dataset=dict(type='vit_plugin.ImageNet21k', ...)))

and keep ``vit_plugin.SkipBadSamplesHook`` among the hooks (vit_plugin's default runtime has it as
``default_hooks.bad_samples``; other runtimes add ``custom_hooks=[dict(type='vit_plugin.SkipBadSamplesHook')]``).

* A sample whose loading raises ``ImageDecodeError`` (truncated, not an image, unsupported mode, too
  large, corrupt), ``FileNotFoundError`` or ``ShardReadError`` (its byte range of a tar shard cannot be
  read) is replaced by another sample chosen deterministically from its index (:func:`replacement_candidates`): the next one, then a fixed pseudo-random sequence. The
  same bad index always gets the same replacement, so ``--resume`` repeats the uninterrupted run.
* The replacement carries the record ``(index, path, reason)`` of every bad sample it stands for in its
  data sample's metainfo (``bad_samples``). The records travel with the batch from the data-loader
  workers to the training process, where the hook reads them: no state shared between processes.
* The hook logs each bad file once (path and reason), sums the counts over all processes of a
  distributed run, reports them at every epoch end and at the end of training, stores them in every
  checkpoint's meta (``meta['bad_samples']``; ``--resume`` continues the count) and stops the run, naming
  the limit, as soon as more than ``floor(max_fraction * len(dataset))`` distinct files were bad.
* Any other exception (a bug in a transform, a missing data root at start-up) still stops training.
"""
import math
from typing import List, Optional, Sequence, Tuple, Union

from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS as MMENGINE_DATASETS

from vit_plugin.datasets.decode import ImageDecodeError
from vit_plugin.datasets.shards.errors import ShardReadError
from vit_plugin.registry import DATASETS

#: Metainfo key of a replacement's data sample: a tuple of ``(index, path, reason)`` records.
RECORD_KEY = 'bad_samples'
#: Exceptions that mark a sample as bad (anything else propagates): a bad image, a missing file, or a
#: byte range of a tar shard that cannot be read (truncated, unreachable).
SKIPPED_ERRORS = (ImageDecodeError, FileNotFoundError, ShardReadError)

_MASK64 = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64: a fixed, well-spread 64-bit hash of ``value`` (the same on every machine)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def replacement_candidates(index: int, size: int, count: int) -> List[int]:
    """The ``count`` (at most ``size - 1``) distinct samples tried, in order, in place of the bad sample
    ``index`` of a dataset of ``size``.

    First the next sample (in a list sorted by class, usually one of the same class), then positions
    drawn by a fixed hash of (index, attempt), which leave a run of bad neighbours (a damaged folder)
    at once. A pure function of its arguments: no random generator is consumed.
    """
    candidates, seen, attempt = [], {index}, 0
    while len(candidates) < min(count, size - 1):
        candidate = (index + 1) % size if attempt == 0 else _mix(index * 1_000_003 + attempt) % size
        attempt += 1
        if candidate not in seen:
            seen.add(candidate)
            candidates.append(candidate)
    return candidates


class BadSampleLimitExceeded(RuntimeError):
    """More samples were bad than the skip policy allows."""


def describe_error(err: BaseException, fallback_path: Optional[str]) -> Tuple[str, str]:
    """``(path, reason)`` of a skipped sample's exception."""
    if isinstance(err, ImageDecodeError) and err.reason:
        return str(err.path or fallback_path), f'{err.reason} ({err.detail})' if err.detail else err.reason
    if isinstance(err, FileNotFoundError):
        return str(err.filename or fallback_path), 'missing file'
    if isinstance(err, ShardReadError):
        return str(err.url or fallback_path), err.reason or 'unreadable shard'
    return str(fallback_path), f'{type(err).__name__}: {err}'


@DATASETS.register_module()
class SkipBadSamples:
    """Wrap a training dataset so that bad samples are replaced, logged and counted, within a limit.

    See the module docstring for the behaviour. The wrapped dataset keeps its length, ``metainfo`` and
    labels; only ``__getitem__`` changes.

    Args:
        dataset (BaseDataset | dict): The training dataset or its config.
        max_fraction (float): Most bad samples allowed, as a fraction of the dataset's length: the run
            stops once more than ``floor(max_fraction * len(dataset))`` distinct samples were bad.
            E.g. 1e-4 allows 1,419 of ImageNet-21k's 14,197,122 images.
        max_attempts (int): Replacements tried for one bad sample before the run stops (a dataset
            that is mostly unreadable, e.g. a wrong image folder). Defaults to 16.
        lazy_init (bool): Defer building the wrapped dataset's index until first use. Defaults to False.

    Raises:
        BadSampleLimitExceeded: ``max_attempts`` replacements in a row were bad too, or (a safeguard
            that does not depend on the hook) one data-loader process alone met more bad samples than
            allowed.
    """

    def __init__(self, dataset: Union[BaseDataset, dict], max_fraction: float, max_attempts: int = 16,
                 lazy_init: bool = False):
        if isinstance(dataset, dict):
            dataset = MMENGINE_DATASETS.build(dataset)
        if not isinstance(max_fraction, (int, float)) or not 0 <= max_fraction < 1:
            raise ValueError(f'SkipBadSamples: max_fraction must be in [0, 1), got {max_fraction!r} '
                             f'(e.g. 1e-4: at most one bad sample in 10,000)')
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f'SkipBadSamples: max_attempts must be a positive int, got {max_attempts!r}')
        if getattr(dataset, 'test_mode', False):
            raise ValueError('SkipBadSamples is for training datasets: an evaluation must see every sample '
                             f'(the wrapped {type(dataset).__name__} has test_mode=True).')
        self.dataset = dataset
        self.max_fraction = float(max_fraction)
        self.max_attempts = max_attempts
        self._seen = set()  # bad indices met by this process (the safeguard's count)
        self._fully_initialized = False
        if not lazy_init:
            self.full_init()

    @property
    def metainfo(self) -> dict:
        return self.dataset.metainfo

    def full_init(self) -> None:
        if self._fully_initialized:
            return
        if hasattr(self.dataset, 'full_init'):
            self.dataset.full_init()
        self._fully_initialized = True

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def allowed(self) -> int:
        """The most distinct bad samples the run may meet."""
        return math.floor(self.max_fraction * len(self) + 1e-9)

    def limit_text(self) -> str:
        return (f'the limit of {self.allowed} bad samples (max_fraction={self.max_fraction:g} of '
                f'{len(self):,} samples)')

    def _path_of(self, index: int) -> Optional[str]:
        try:
            return self.dataset.get_data_info(index).get('img_path')
        except Exception:  # noqa: BLE001 (a name for the message only)
            return None

    def get_data_info(self, index: int) -> dict:
        return self.dataset.get_data_info(index)

    def __getattr__(self, name):  # get_gt_labels, get_cat_ids, CLASSES, ... of the wrapped dataset
        if name.startswith('_') or name == 'dataset':
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: int):
        if not self._fully_initialized:
            self.full_init()
        records = []
        size = len(self)
        index = int(index) % size if size else index
        for candidate in [index] + replacement_candidates(index, size, self.max_attempts):
            try:
                data = self.dataset[candidate]
            except SKIPPED_ERRORS as err:
                path, reason = describe_error(err, self._path_of(candidate))
                records.append((int(candidate), path, reason))
                self._seen.add(int(candidate))
                if len(self._seen) > self.allowed:
                    raise BadSampleLimitExceeded(
                        f'SkipBadSamples: {len(self._seen)} distinct bad samples in this data-loader process '
                        f'alone exceed {self.limit_text()}; the latest: {path}: {reason}. Fix or remove the '
                        f'files (the training log lists them), or raise max_fraction.') from err
                continue
            return self._attach(data, records, candidate)
        listing = '; '.join(f'{i} {p}: {r}' for i, p, r in records)
        raise BadSampleLimitExceeded(
            f'SkipBadSamples: sample {index} and its {len(records) - 1} replacement candidates are all bad '
            f'({listing}). Is the data root right? Check the files, or raise max_attempts.')

    @staticmethod
    def _attach(data, records: Sequence[tuple], index: int):
        samples = data.get('data_samples') if isinstance(data, dict) else None
        if samples is None or not hasattr(samples, 'set_metainfo'):
            raise TypeError(
                f'SkipBadSamples needs pipelines that end with a packing transform (PackInputs, '
                f'PackDetInputs, ...) whose data_samples carry the record of a replaced sample; sample {index} '
                f'is {type(data).__name__} without data_samples.')
        if records:
            samples.set_metainfo({RECORD_KEY: tuple(records)})
        return data

    def __repr__(self) -> str:
        return (f'SkipBadSamples(max_fraction={self.max_fraction:g}, allowed={self.allowed}, '
                f'dataset={type(self.dataset).__name__} of {len(self)} samples)')


def records_in_batch(data_batch) -> List[tuple]:
    """The ``(index, path, reason)`` records carried by a collated batch (:data:`RECORD_KEY`)."""
    if not isinstance(data_batch, dict):
        return []
    samples = data_batch.get('data_samples')
    if samples is None:
        return []
    if not isinstance(samples, (list, tuple)):
        samples = [samples]
    found = []
    for sample in samples:
        meta = getattr(sample, 'metainfo', None)
        if meta and RECORD_KEY in meta:
            found.extend(tuple(r) for r in meta[RECORD_KEY])
    return found


def find_skip_wrapper(dataset) -> Optional[SkipBadSamples]:
    """The :class:`SkipBadSamples` in ``dataset`` or among the datasets it wraps, or None."""
    seen = set()
    stack = [dataset]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, SkipBadSamples):
            return current
        inner = current.__dict__.get('dataset') if hasattr(current, '__dict__') else None
        stack.append(inner)
        stack.extend(getattr(current, 'datasets', None) or [])
    return None
