"""Checkpoints record the training data's fingerprint; ``--resume`` onto changed data names the change and
refuses, or warns once under ``default_hooks.data_identity.allow_data_change=True``.

The end-to-end run trains a 1-block ViT for 2 iterations on 3 tar shards (``tools/train.py``, in the test
process); shard 1 is then written again with 4 samples fewer, and the finished run is resumed (it has
nothing left to train, so the resumes cost only their start)."""
import os.path as osp

import pytest

from helpers.common import REPO
from helpers.tar_shards import make_samples, write_wds
from helpers.in_process import train_in_process
from vit_plugin.checkpoint.safe_load import load_local_checkpoint
from vit_plugin.engine.data_identity import META_KEY, data_changes, dataset_fingerprint


def write_config(path, data_root):
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=1, num_heads=2, mlp_dims=64)),
             head=dict(in_channels=32))
train_dataloader = dict(
    _delete_=True, batch_size=4, num_workers=0, persistent_workers=False,
    sampler=dict(type='vit_plugin.BlockShuffleSampler', seed=0, block_size=4, mix_blocks=2),
    dataset=dict(type='vit_plugin.TarShardDataset', data_root={data_root!r}, index_workers=1,
                 pipeline=[dict(type='vit_plugin.LoadImageFromFile'), dict(type='mmpretrain.Resize', scale=(32, 32)),
                           dict(type='mmpretrain.PackInputs')]))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
param_scheduler = []
train_cfg = dict(_delete_=True, type='vit_plugin.IterBasedTrainLoop', max_iters=2)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=2))
""")
    return str(path)


@pytest.fixture(scope='module')
def changed_shard(tmp_path_factory):
    """A finished run, its checkpoint's fingerprint, and two resumes after shard 1 lost 4 samples: one
    refused, one allowed."""
    root = tmp_path_factory.mktemp('data_identity')
    data, work = root / 'shards', root / 'run'
    samples = make_samples(48)
    names = write_wds(str(data), samples, [16, 16, 16])
    # a config file per run: each run's logger is its own
    first, again, anyway = (write_config(root / f'{run}.py', str(data)) for run in ('first', 'again', 'anyway'))
    assert train_in_process(first, work).code == 0
    recorded = load_local_checkpoint(str(work / 'iter_2.pth'), map_location='cpu')['meta'][META_KEY]  # weights-only
    write_wds(str(data), samples[:28] + samples[32:], [16, 12, 16])  # shards 0 and 2 unchanged
    refused = train_in_process(again, work, '--resume')
    allowed = train_in_process(anyway, work, '--resume', '--cfg-options',
                               'default_hooks.data_identity.allow_data_change=True')
    return dict(names=names, data=data, recorded=recorded, refused=refused, allowed=allowed)


@pytest.mark.slow
def test_checkpoint_records_shard_names_sizes_and_sample_counts(changed_shard):
    recorded, data = changed_shard['recorded'], changed_shard['data']
    assert recorded['samples'] == 48
    assert [name for name, _, _ in recorded['shards']] == changed_shard['names']
    assert [count for _, _, count in recorded['shards']] == [16, 16, 16]
    assert recorded['shards'][0][1] == osp.getsize(data / changed_shard['names'][0])


@pytest.mark.slow
def test_resume_onto_a_changed_shard_names_it_and_refuses(changed_shard):
    refused = changed_shard['refused']
    # tools/train.py exits 1 with this message, before the first iteration
    message = refused.code
    assert isinstance(message, str) and message.startswith('ERROR: --resume onto other training data'), refused
    assert 'imagenet22k-train-0001.tar (16 -> 12 samples)' in message
    assert 'imagenet22k-train-0000.tar' not in message and 'imagenet22k-train-0002.tar' not in message
    assert 'allow_data_change=True' in message


@pytest.mark.slow
def test_allowed_resume_onto_a_changed_shard_warns_once(changed_shard):
    allowed = changed_shard['allowed']
    assert allowed.code == 0, allowed.output[-4000:]
    output = allowed.output
    assert output.count('other training data') == 1 and 'imagenet22k-train-0001.tar' in output


def test_changes_name_each_shard_added_removed_resized_or_recounted():
    saved = {'samples': 30, 'shards': [['a.tar', 100, 10], ['b.tar', 100, 10], ['c.tar', 100, 10]]}
    assert data_changes(saved, saved) == []
    current = {'samples': 29, 'shards': [['a.tar', 100, 10], ['b.tar', 90, 9], ['d.tar', 100, 10]]}
    assert data_changes(saved, current) == ['shard removed: c.tar', 'shard added: d.tar',
                                            'size changed: b.tar (100 -> 90 bytes)',
                                            'sample count changed: b.tar (10 -> 9 samples)']
    reordered = {'samples': 30, 'shards': saved['shards'][::-1]}
    assert data_changes(saved, reordered) == ['the shards are in another order']
    assert data_changes({'samples': 1797}, {'samples': 1796}) == ['1797 -> 1796 samples']
    assert dataset_fingerprint(list(range(5))) == {'samples': 5}
