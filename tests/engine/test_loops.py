"""vit_plugin.IterBasedTrainLoop: a resumed run continues with the uninterrupted run's batches and loads
none of the skipped ones, on both stacks.

One uninterrupted run and one run resumed from its middle checkpoint, both through ``tools/train.py``
in the test process on the shipped shard config (``_base_/datasets/imagenet21k_wds.py``) with a 2-block
ViT, tar shards in timm's layout written by the test, 2 data-loader workers and gradient accumulation
over 2 iterations. The pipeline is deterministic (no crop), so that equal batches give equal losses: host-side
augmentations in the workers draw from the workers' own streams, which a resumed run starts afresh.
"""
import itertools
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.dataset import InfiniteSampler
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import DataLoader, Dataset

from helpers.common import REPO
from helpers.in_process import train_in_process
from helpers.loss_recorder import LossRecorderHook
from helpers.sample_recorder import read_batches, read_loads
from helpers.tar_shards import make_samples, write_wds
from vit_plugin.datasets import BlockShuffleSampler
from vit_plugin.engine.loops import ResumableDataloaderIterator

ITERS = 12  # 6 optimizer steps at global batch 16 = 2 processes' worth of batch 8
RESUME_AT = 6
BATCH = 8


def write_config(path, shards, loads):
    bases = [osp.join(REPO, 'configs', '_base_', p) for p in (
        'models/vit_demo.py', 'datasets/imagenet21k_wds.py', 'schedules/vit_pretrain_in21k.py', 'default_runtime.py')]
    path.write_text(f"""
_base_ = {bases!r}
custom_imports = dict(imports=['vit_plugin', 'helpers.sample_recorder'], allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)),
             head=dict(in_channels=32, num_classes=6))
data_preprocessor = dict(num_classes=6)
pipeline = [dict(type='RecordLoads', out_dir={loads!r}), dict(type='vit_plugin.LoadImageFromFile'),
            dict(type='Resize', scale=(32, 32)), dict(type='PackInputs')]
train_dataloader = dict(batch_size={BATCH}, num_workers=2, persistent_workers=False,
                        dataset=dict(data_root={shards!r}, label_space=None, num_classes=6, index_workers=2,
                                     pipeline=pipeline))
global_batch_size = 16
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2),
                   dict(type='LinearLR', start_factor=1.0, end_factor=0.0, by_epoch=False, begin=2, end=6)]
train_cfg = dict(max_iters=6)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=3, max_keep_ckpts=5))
custom_hooks = [dict(type='BatchRecorderHook')]
""")
    return str(path)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp('resume')
    shards = str(root / 'shards')
    write_wds(shards, make_samples(160, seed=3, size=32), (40, 40, 40, 40))  # 20 batches per epoch
    result = {}
    for name, extra in (('full', ()), ('resumed', ('--resume', str(root / 'full' / f'iter_{RESUME_AT}.pth')))):
        (root / f'loads_{name}').mkdir()
        cfg = write_config(root / f'{name}.py', shards, str(root / f'loads_{name}'))
        outcome = train_in_process(cfg, root / name, *extra)
        assert outcome.code == 0, outcome.output[-4000:]
        result[name] = dict(batches=read_batches(root / name), loads=read_loads(str(root / f'loads_{name}')),
                            output=outcome.output)
    return result


@pytest.mark.slow
def test_a_tiny_vit_trains_from_shards_through_tools_train(runs):
    full = runs['full']
    assert sorted(full['batches']) == list(range(ITERS))
    assert all(np.isfinite(b['loss']) and len(b['paths']) == BATCH for b in full['batches'].values())
    assert 'Indexed 160 samples of 4 shards' in full['output']


@pytest.mark.slow
def test_the_resumed_run_trains_on_the_uninterrupted_runs_batches(runs):
    full, resumed = runs['full']['batches'], runs['resumed']['batches']
    assert sorted(resumed) == list(range(RESUME_AT, ITERS))
    assert [resumed[i]['paths'] for i in resumed] == [full[i]['paths'] for i in resumed]
    np.testing.assert_allclose([resumed[i]['loss'] for i in resumed], [full[i]['loss'] for i in resumed],
                               rtol=1e-5)


@pytest.mark.slow
def test_the_resumed_run_loads_none_of_the_skipped_batches(runs):
    skipped = {p for i in range(RESUME_AT) for p in runs['full']['batches'][i]['paths']}
    trained = {p for i in range(RESUME_AT, ITERS) for p in runs['full']['batches'][i]['paths']}
    assert skipped <= set(runs['full']['loads'])  # the counter sees what a run loads
    loads = runs['resumed']['loads']
    assert not skipped & set(loads)
    assert trained <= set(loads) and len(loads) <= (ITERS - RESUME_AT + 4) * BATCH  # + what workers prefetch
    assert 'Resuming at iteration 6: the sampler skips 6 batches (nothing is loaded)' in runs['resumed']['output']


@pytest.mark.parametrize('sampler', ['InfiniteSampler', 'BlockShuffleSampler'])
def test_a_sampler_skips_to_where_the_uninterrupted_stream_is(sampler):
    """Both samplers the configs use can skip, on both stacks (mmengine 0.10.7's InfiniteSampler through
    vit_plugin.compat): the batches after the skip are the uninterrupted run's, and none is loaded."""
    def loader():
        kind = InfiniteSampler if sampler == 'InfiniteSampler' else BlockShuffleSampler
        return DataLoader(LoadCounter(40), batch_size=4, sampler=kind(range(40), seed=3), collate_fn=list)

    full = list(itertools.islice(ResumableDataloaderIterator(loader()), 15))
    resumed_loader = loader()
    resumed = ResumableDataloaderIterator(resumed_loader)
    assert resumed.skip_iter(9)
    assert list(itertools.islice(resumed, 6)) == full[9:]
    assert resumed_loader.dataset.loads == 24  # the 6 batches after the skip, nothing before


def test_a_sampler_that_cannot_skip_is_stepped_through_with_a_warning():
    data = LoadCounter(20)
    full = list(itertools.islice(ResumableDataloaderIterator(DataLoader(range(20), batch_size=4)), 7))
    resumed = ResumableDataloaderIterator(DataLoader(data, batch_size=4, collate_fn=list))
    assert not resumed.skip_iter(6)  # a SequentialSampler: the batches are drawn
    assert data.loads == 24 and next(resumed) == full[6].tolist()


class LoadCounter(Dataset):
    """Counts the samples loaded."""

    def __init__(self, size):
        self.size, self.loads = size, 0

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        self.loads += 1
        return idx


class DropoutRegressor(BaseModel):
    """Weights initialised by the runner and dropout in every step: both draw from the global generator."""

    def __init__(self):
        super().__init__(init_cfg=dict(type='Normal', layer='Linear', std=0.5))
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 1))

    def forward(self, inputs, targets, mode='loss'):
        return dict(loss=((self.net(inputs).squeeze(1) - targets) ** 2).mean())


def collate_xy(batch):
    return dict(inputs=torch.stack([x for x, _ in batch]), targets=torch.stack([y for _, y in batch]))


def losses_with(loop, tmp_path):
    data = [(torch.randn(4, generator=torch.Generator().manual_seed(i)), torch.tensor(float(i % 3)))
            for i in range(24)]
    recorder = LossRecorderHook()
    runner = Runner(model=DropoutRegressor(), work_dir=str(tmp_path / loop), default_scope='mmengine',
                    train_dataloader=dict(dataset=data, batch_size=4, num_workers=0, collate_fn=collate_xy,
                                          sampler=dict(type='InfiniteSampler', shuffle=True)),
                    optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05)),
                    train_cfg=dict(type=loop, max_iters=5), randomness=dict(seed=11),
                    default_hooks=dict(logger=None, checkpoint=None),
                    custom_hooks=[recorder])
    runner.train()
    return recorder.losses


def test_the_loop_trains_what_mmengines_loop_trains(tmp_path):
    """The same weights, dropout masks and batches as mmengine's loop for a config that switches to it."""
    assert losses_with('vit_plugin.IterBasedTrainLoop', tmp_path) == losses_with('IterBasedTrainLoop', tmp_path)
