"""The training-process side of the skip policy :class:`vit_plugin.datasets.skip.SkipBadSamples`."""
import math
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.dist import all_gather_object, all_reduce, get_world_size
from mmengine.hooks import Hook
from mmengine.runner import IterBasedTrainLoop

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.datasets.skip import BadSampleLimitExceeded, find_skip_wrapper, records_in_batch
from vit_plugin.registry import HOOKS

#: Key of the counts in a checkpoint's ``meta``.
META_KEY = 'bad_samples'


@HOOKS.register_module()
class SkipBadSamplesHook(Hook):
    """Log, count, report and limit the bad samples that ``vit_plugin.SkipBadSamples`` replaced.

    Inert unless the training dataset is, or wraps, a ``SkipBadSamples``. All processes stop at the same
    iteration with ``BadSampleLimitExceeded`` once more distinct files were bad than
    ``floor(max_fraction * len(dataset))``; counts are kept in ``meta['bad_samples']`` of every
    checkpoint. See docs/configs.md#bad-files-checked-decoding-and-a-counted-skip-policy.

    Args:
        report_interval (int, optional): Iterations between reports of an iteration-based loop.
            Defaults to None: one pass over the training data.
    """
    priority = 'NORMAL'  # before the logger and checkpoint hooks of the same iteration

    def __init__(self, report_interval: Optional[int] = None):
        if report_interval is not None and (not isinstance(report_interval, int) or report_interval < 1):
            raise ValueError(f'SkipBadSamplesHook: report_interval must be a positive int or None, got '
                             f'{report_interval!r}')
        self.report_interval = report_interval
        self.wrapper = None
        self.files: Dict[int, Tuple[str, str]] = {}  # index -> (path, reason), over all processes
        self.replacements = 0
        self._restored: Optional[dict] = None
        self._every: Optional[int] = None

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """The counts as stored in a checkpoint's meta (plain lists, strings and numbers)."""
        return dict(count=len(self.files), replacements=self.replacements, allowed=self.wrapper.allowed,
                    max_fraction=self.wrapper.max_fraction, dataset_size=len(self.wrapper),
                    files=[[index, path, reason] for index, (path, reason) in sorted(self.files.items())])

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if mmengine_compat.resumes(runner):  # a resumed run continues the count; load_from starts anew
            self._restored = (checkpoint.get('meta') or {}).get(META_KEY)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.wrapper is not None:
            checkpoint.setdefault('meta', {})[META_KEY] = self.state_dict()

    # ----------------------------------------------------------------------------- training
    def before_train(self, runner) -> None:
        self.wrapper = find_skip_wrapper(getattr(runner.train_dataloader, 'dataset', None))
        if self.wrapper is None:
            return
        restored, self._restored = self._restored, None
        if restored is not None and restored.get('dataset_size') == len(self.wrapper):
            self.files = {int(i): (str(p), str(r)) for i, p, r in restored.get('files', [])}
            self.replacements = int(restored.get('replacements', 0))
        elif restored is not None:
            runner.logger.warning(f'SkipBadSamples: the checkpoint counted bad samples of a dataset of '
                                  f'{restored.get("dataset_size")} samples, this run has {len(self.wrapper)}; '
                                  f'counting starts at 0.')
        if isinstance(runner.train_loop, IterBasedTrainLoop):
            self._every = self.report_interval or self._iterations_per_pass(runner)
        runner.logger.info(f'SkipBadSamples: bad training samples are replaced, logged and counted, up to '
                           f'{self.wrapper.limit_text()}' + (f'; {len(self.files)} counted so far'
                                                             if self.files else '') + '.')

    def _iterations_per_pass(self, runner) -> int:
        batch = getattr(runner.train_dataloader, 'batch_size', None) or 1
        return max(1, math.ceil(len(self.wrapper) / (batch * get_world_size())))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self.wrapper is None:
            return
        self._merge(runner, self._gather(records_in_batch(data_batch)))
        if len(self.files) > self.wrapper.allowed:
            newest = list(self.files.items())[-3:]
            message = (f'SkipBadSamples: {len(self.files)} distinct bad samples exceed {self.wrapper.limit_text()} '
                       f'at iteration {runner.iter + 1}; the latest: '
                       + '; '.join(f'{path}: {reason}' for _, (path, reason) in newest)
                       + '. Fix or remove the files (each is logged above), or raise max_fraction.')
            runner.logger.error(message)
            raise BadSampleLimitExceeded(message)
        if self._every and (runner.iter + 1) % self._every == 0:
            self._report(runner, f'iteration {runner.iter + 1}')

    @staticmethod
    def _gather(records: List[tuple]) -> List[tuple]:
        if get_world_size() == 1:
            return records
        count = torch.tensor([len(records)], dtype=torch.int64)
        all_reduce(count)  # sum; moves to the backend's device and back
        if not int(count.item()):
            return []
        return [tuple(r) for per_rank in all_gather_object(records) for r in per_rank]

    def _merge(self, runner, records: List[tuple]) -> None:
        for index, path, reason in records:
            self.replacements += 1
            if int(index) not in self.files:
                self.files[int(index)] = (str(path), str(reason))
                runner.logger.warning(f'SkipBadSamples: skipped bad sample {index}: {path}: {reason} '
                                      f'({len(self.files)} of at most {self.wrapper.allowed}).')

    def _report(self, runner, when: str) -> None:
        runner.logger.info(f'SkipBadSamples after {when}: {len(self.files)} bad samples skipped '
                           f'({self.replacements} replacements), {self.wrapper.limit_text()}.')

    def after_train_epoch(self, runner) -> None:
        if self.wrapper is not None and not isinstance(runner.train_loop, IterBasedTrainLoop):
            self._report(runner, f'epoch {runner.epoch + 1}')

    def after_train(self, runner) -> None:
        if self.wrapper is not None:
            self._report(runner, f'training ({runner.iter} iterations)')
