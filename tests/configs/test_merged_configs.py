"""Every config merges to the dict recorded in ``tests/configs/merged_configs/``.

The record of a config is its fully merged dict (all ``_base_`` files, mmdet's and mmpretrain's
included) written as a Python literal with sorted keys, one value per line where it is long, so that
tuples stay tuples and a changed number shows as a one-line diff. The configs share ``_base_``
fragments; the records pin what each concrete config means, whatever fragments it is made of.
Top-level names that start with ``_`` are left out: they are the private variables through which a
fragment hands a block to configs that also inherit mmdet's recipes (two bases may not define the same
name), and nothing reads them.

A deliberate change of a config's meaning rewrites its record:

    UPDATE_MERGED_CONFIGS=1 python -m pytest tests/configs/test_merged_configs.py

and the diff of the record shows the change for review.
"""
import difflib
import glob
import os
import os.path as osp
import pprint

import pytest
from mmengine.config import Config
from helpers.common import REPO

RECORDS = osp.join(REPO, 'tests', 'configs', 'merged_configs')


def concrete_configs():
    """Config files users run: ``configs/*.py`` and ``projects/*/configs/*.py``, without the
    fragments (``_base_/`` and files whose name starts with ``_``), as paths relative to the root."""
    found = glob.glob(osp.join(REPO, 'configs', '*.py')) + glob.glob(osp.join(REPO, 'projects', '*', 'configs', '*.py'))
    return sorted(osp.relpath(p, REPO) for p in found if not osp.basename(p).startswith('_'))


def _relative(value):
    """``value`` with absolute paths into the repository written relative to its root."""
    if isinstance(value, dict):
        return {k: _relative(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_relative(v) for v in value)
    if isinstance(value, str) and value.startswith(REPO + os.sep):
        return osp.relpath(value, REPO)
    return value


def merged_text(config: str) -> str:
    """The fully merged dict of ``config`` (relative to the root) as sorted, line-broken literal text."""
    cfg = Config.fromfile(osp.join(REPO, config), import_custom_modules=False).to_dict()
    cfg = {k: v for k, v in cfg.items() if not k.startswith('_')}
    return pprint.pformat(_relative(cfg), width=100, sort_dicts=True) + '\n'


def record_path(config: str) -> str:
    return osp.join(RECORDS, osp.splitext(config)[0] + '.txt')


def test_every_config_has_a_record_and_every_record_a_config():
    recorded = sorted(osp.relpath(p, RECORDS)[:-len('.txt')] + '.py'
                      for p in glob.glob(osp.join(RECORDS, '**', '*.txt'), recursive=True))
    assert recorded == concrete_configs()


@pytest.mark.parametrize('config', concrete_configs())
def test_config_merges_to_its_record(config):
    text = merged_text(config)
    path = record_path(config)
    if os.environ.get('UPDATE_MERGED_CONFIGS') == '1':
        os.makedirs(osp.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)
        pytest.skip(f'rewrote {osp.relpath(path, REPO)}')
    assert osp.isfile(path), f'{config} has no record; write it with UPDATE_MERGED_CONFIGS=1 (see the docstring)'
    with open(path) as f:
        recorded = f.read()
    if text != recorded:
        diff = ''.join(difflib.unified_diff(recorded.splitlines(True), text.splitlines(True),
                                            'recorded', 'merged now', n=2))
        pytest.fail(f'{config} no longer merges to {osp.relpath(path, REPO)}:\n{diff}', pytrace=False)
