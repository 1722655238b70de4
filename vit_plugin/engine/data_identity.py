"""A checkpoint records the data it trained on; ``--resume`` onto other data says what changed.
See docs/data.md#when-data-fails.
"""
from typing import List, Optional

from mmengine.hooks import Hook

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.registry import HOOKS

#: Key of a checkpoint's ``meta`` holding the training data's fingerprint.
META_KEY = 'data_fingerprint'
_SHOWN = 3  # changes named per kind; the rest are counted


class DataChangedError(ValueError):
    """``--resume`` onto data that differs from the checkpoint's; the message names what changed."""


def dataset_fingerprint(dataset) -> dict:
    """The ``data_fingerprint()`` of ``dataset`` or of one it wraps, else ``{'samples': len(dataset)}``."""
    inner = dataset
    for _ in range(8):  # SkipBadSamples, mmengine's dataset wrappers
        if callable(getattr(inner, 'data_fingerprint', None)):
            return inner.data_fingerprint()
        inner = getattr(inner, 'dataset', None)
        if inner is None:
            break
    return {'samples': len(dataset)}


def _listed(kind: str, names: List[str]) -> str:
    shown = ', '.join(names[:_SHOWN]) + (f' and {len(names) - _SHOWN} more' if len(names) > _SHOWN else '')
    return f'{kind} {shown}'


def data_changes(saved: dict, current: dict) -> List[str]:
    """What differs between two fingerprints, one phrase per kind of change (empty: the same data)."""
    changes = []
    if saved.get('shards') is not None and current.get('shards') is not None:
        old = {name: (size, count) for name, size, count in saved['shards']}
        new = {name: (size, count) for name, size, count in current['shards']}
        removed = [name for name in old if name not in new]
        added = [name for name in new if name not in old]
        resized = [f'{name} ({old[name][0]} -> {new[name][0]} bytes)' for name in old
                   if name in new and old[name][0] != new[name][0]]
        recounted = [f'{name} ({old[name][1]} -> {new[name][1]} samples)' for name in old
                     if name in new and old[name][1] != new[name][1]]
        for kind, names in (('shard removed:', removed), ('shard added:', added), ('size changed:', resized),
                            ('sample count changed:', recounted)):
            if names:
                changes.append(_listed(kind, names))
        if not changes and [s[0] for s in saved['shards']] != [s[0] for s in current['shards']]:
            changes.append('the shards are in another order')
    if not changes and saved.get('samples') != current.get('samples'):
        changes.append(f'{saved.get("samples")} -> {current.get("samples")} samples')
    return changes


@HOOKS.register_module()
class DataIdentityHook(Hook):
    """Record the training data's fingerprint in every checkpoint; refuse ``--resume`` onto other data.

    Raises :class:`DataChangedError`, naming the changes, before the first resumed iteration.

    Args:
        allow_data_change (bool): Resume anyway, with one warning naming the changes. Defaults to False.
    """
    priority = 'VERY_HIGH'

    def __init__(self, allow_data_change: bool = False):
        if not isinstance(allow_data_change, bool):
            raise ValueError(f'DataIdentityHook: allow_data_change must be True or False, got '
                             f'{allow_data_change!r} (default_hooks.data_identity in the config).')
        self.allow_data_change = allow_data_change
        self.fingerprint: Optional[dict] = None
        self._saved: Optional[dict] = None

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if mmengine_compat.resumes(runner):  # load_from alone starts a new run on any data
            self._saved = (checkpoint.get('meta') or {}).get(META_KEY)

    def before_train(self, runner) -> None:
        self.fingerprint = dataset_fingerprint(runner.train_dataloader.dataset)
        saved, self._saved = self._saved, None
        if saved is None:
            return
        changes = data_changes(saved, self.fingerprint)
        if not changes:
            return
        what = '; '.join(changes)
        if not self.allow_data_change:
            raise DataChangedError(
                f'--resume onto other training data than the checkpoint\'s: {what}. The sampler\'s order '
                f'depends on the data. Restore the data, or resume anyway with '
                f'default_hooks.data_identity.allow_data_change=True.')
        runner.logger.warning(f'Resuming onto other training data than the checkpoint\'s (allow_data_change): '
                              f'{what}.')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.fingerprint is not None:
            checkpoint.setdefault('meta', {})[META_KEY] = self.fingerprint


def use_data_identity_hook(cfg) -> None:
    """Add ``default_hooks.data_identity`` unless the config has that key (``None`` switches it off)."""
    hooks = cfg.get('default_hooks')
    if hooks is None:
        cfg.default_hooks = hooks = {}
    if 'data_identity' not in hooks:
        hooks['data_identity'] = dict(type='vit_plugin.DataIdentityHook')
    elif isinstance(hooks['data_identity'], dict) and 'type' not in hooks['data_identity']:
        hooks['data_identity']['type'] = 'vit_plugin.DataIdentityHook'  # e.g. from --cfg-options


__all__ = ['DataChangedError', 'DataIdentityHook', 'META_KEY', 'data_changes', 'dataset_fingerprint',
           'use_data_identity_hook']
