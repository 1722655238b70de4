"""The skip policy (``vit_plugin.SkipBadSamples`` + ``SkipBadSamplesHook``): deterministic replacements,
records through data-loader workers, a real training run that reports the exact count and resumes
exactly, the stop past the limit, and the sum over two DDP processes."""
import os
import os.path as osp
import re
import subprocess

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import default_collate, pseudo_collate
from mmengine.registry import init_default_scope
from PIL import Image

from helpers.bad_images import encode, reference
from helpers.collate import collate_skip_records
from helpers.common import REPO, free_port, read_losses, run_env
from helpers.in_process import train_in_process
from vit_plugin.datasets import decode
from vit_plugin.datasets.skip import (BadSampleLimitExceeded, SkipBadSamples, records_in_batch,
                                      replacement_candidates)


@pytest.fixture(scope='module', autouse=True)
def mmpretrain_scope():
    init_default_scope('mmpretrain')


# ----------------------------------------------------------------------------------- skip policy
class TinyDataset:
    """Five samples; the pipeline of sample ``i`` raises what ``errors[i]`` says."""
    test_mode = False

    def __init__(self, errors):
        self.errors = errors
        self.metainfo = {'classes': ('a', 'b')}

    def __len__(self):
        return 5

    def full_init(self):
        pass

    def get_data_info(self, i):
        return {'img_path': f'/data/{i}.jpg'}

    def __getitem__(self, i):
        from mmpretrain.structures import DataSample
        error = self.errors.get(i)
        if error == 'truncated':
            raise decode.image_error(f'/data/{i}.jpg', decode.TRUNCATED, 'JPEG: no end-of-image marker')
        if error == 'missing':
            raise FileNotFoundError(2, 'No such file', f'/data/{i}.jpg')
        if error == 'bug':
            raise KeyError('img_shape')
        return {'inputs': torch.full((1, ), float(i)), 'data_samples': DataSample(metainfo={'sample_idx': i})}


def test_bad_samples_are_replaced_deterministically_and_recorded():
    wrapper = SkipBadSamples(TinyDataset({1: 'truncated', 2: 'missing'}), max_fraction=0.4)
    assert wrapper.allowed == 2 and len(wrapper) == 5 and wrapper.metainfo == {'classes': ('a', 'b')}
    candidates = replacement_candidates(1, 5, 16)
    assert candidates[0] == 2 and 1 not in candidates and all(0 <= c < 5 for c in candidates)
    assert candidates == replacement_candidates(1, 5, 16)  # a pure function: no generator consumed
    first = wrapper[1]  # 1 -> 2 (also bad) -> the next candidate
    assert first['inputs'].item() == candidates[1] != 2
    assert first['data_samples'].bad_samples == ((1, '/data/1.jpg', 'truncated (JPEG: no end-of-image marker)'),
                                                 (2, '/data/2.jpg', 'missing file'))
    assert wrapper[1]['inputs'].item() == candidates[1]  # the same replacement every time
    assert 'bad_samples' not in wrapper[0]['data_samples']
    batch = pseudo_collate([wrapper[i] for i in range(5)])
    assert [r[0] for r in records_in_batch(batch)] == [1, 2, 2]  # sample 2: its own replacement record
    assert [r[0] for r in records_in_batch(default_collate([wrapper[1]]))] == [1, 2]
    with pytest.raises(KeyError):  # any other error is a bug: it still stops
        SkipBadSamples(TinyDataset({0: 'bug'}), max_fraction=0.5)[0]
    with pytest.raises(BadSampleLimitExceeded, match='the limit of 0 bad samples'):
        SkipBadSamples(TinyDataset({4: 'truncated'}), max_fraction=0.1)[4]
    with pytest.raises(BadSampleLimitExceeded, match='its 2 replacement candidates are all bad'):
        SkipBadSamples(TinyDataset({i: 'missing' for i in range(5)}), max_fraction=0.9, max_attempts=2)[0]
    with pytest.raises(ValueError, match='max_fraction must be in'):
        SkipBadSamples(TinyDataset({}), max_fraction=1.5)


def test_records_travel_from_worker_processes_with_the_batch():
    import pickle

    from torch.utils.data import DataLoader
    wrapper = SkipBadSamples(TinyDataset({1: 'truncated', 4: 'missing'}), max_fraction=0.4)
    loader = DataLoader(wrapper, batch_size=2, num_workers=2, collate_fn=collate_skip_records)
    assert sorted(r[:2] for batch in loader for r in batch) == [(1, '/data/1.jpg'), (4, '/data/4.jpg')]
    again = pickle.loads(pickle.dumps(wrapper))  # what spawned workers receive
    assert again[4]['data_samples'].bad_samples[0][:2] == (4, '/data/4.jpg') and again.allowed == 2


def make_list_dataset(root, bad):
    """200 24x24 JPEGs of 4 colour classes in the list-file layout, the indices in ``bad`` broken
    (a truncated JPEG and an HTML page)."""
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    lines = []
    rng = np.random.default_rng(0)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40)]
    for i in range(200):
        label = i % 4
        rel = f'c{label}/{i:03d}.jpg'
        path = osp.join(root, 'train', rel)
        os.makedirs(osp.dirname(path), exist_ok=True)
        pixels = np.clip(np.array(colours[label]) + rng.integers(-60, 60, (24, 24, 3)), 0, 255).astype(np.uint8)
        data = encode(Image.fromarray(pixels), 'JPEG', quality=90)
        if i == bad[0]:
            data = data[:-10]  # the last bytes of the image data and the end-of-image marker are missing
        elif i in bad[1:]:
            data = b'<html>503 Service Unavailable</html>\n'
        with open(path, 'wb') as f:
            f.write(data)
        lines.append(f'{rel} {label}\n')
    with open(osp.join(root, 'meta', 'train.txt'), 'w') as f:
        f.writelines(lines)
    return root


def skip_config(path, root, *, max_fraction=0.01, batch_size=20, workers=2, epochs=3, record_losses=True,
                recorder='helpers.loss_recorder'):
    """A 2-block ViT on the list-file dataset of :func:`make_list_dataset` under the skip policy; with
    ``record_losses`` every rank records its losses through ``recorder`` (the module's name in the process
    that trains: ``loss_recorder`` in a training subprocess)."""
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports=['vit_plugin'] + ([{recorder!r}] if {record_losses} else []),
                      allow_failed_imports=False)
num_classes = 4
data_preprocessor = dict(num_classes=num_classes)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64), img_size=16,
                           patch_size=8),
             head=dict(num_classes=num_classes, in_channels=32))
train_dataloader = dict(
    batch_size={batch_size}, num_workers={workers}, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
    dataset=dict(_delete_=True, type='vit_plugin.SkipBadSamples', max_fraction={max_fraction},
                 dataset=dict(type='vit_plugin.ImageNet21k', data_root={root!r}, ann_file='meta/train.txt',
                              data_prefix='train', num_classes=num_classes,
                              pipeline=[dict(type='vit_plugin.LoadAndInceptionCrop', scale=16,
                                             crop_ratio_range=(0.5, 1.0)),
                                        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
                                        dict(type='PackInputs')])))
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = None
test_evaluator = None
test_cfg = None
param_scheduler = []
train_cfg = dict(by_epoch=True, max_epochs={epochs}, val_interval=1000)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=True, interval=1, max_keep_ckpts=5))
custom_hooks = [dict(type='LossRecorderHook')] if {record_losses} else []
""")
    return str(path)


def first_indices_of_each_rank(n=200, seed=0, epoch=0):
    """The first sample of rank 0 and of rank 1 under mmengine's DefaultSampler (shuffled, 2 ranks)."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    return order[0], order[1]


def checkpoint_meta(path):
    return torch.load(path, map_location='cpu', weights_only=False)['meta']


@pytest.mark.slow
def test_skip_policy_run_reports_the_exact_count_and_resumes_exactly(tmp_path):
    bad = first_indices_of_each_rank()
    root = make_list_dataset(str(tmp_path / 'data'), bad)
    # tools/train.py in this process; a config file per run, so that each run's logger is its own
    cfg, again = (skip_config(tmp_path / f'{run}.py', root) for run in ('full', 'resumed'))
    full = train_in_process(cfg, tmp_path / 'full')
    assert full.code == 0, full.output[-4000:]
    log = full.output
    paths = {i: osp.join(root, 'train', f'c{i % 4}/{i:03d}.jpg') for i in bad}
    for i, reason in zip(bad, ('truncated (JPEG: no end-of-image marker', "not an image (no JPEG")):
        lines = [line for line in log.splitlines() if f'skipped bad sample {i}: {paths[i]}: {reason}' in line]
        assert len(lines) == 1, (i, lines)  # logged once, though met in all three epochs
    for epoch in (1, 2, 3):
        assert (f'SkipBadSamples after epoch {epoch}: 2 bad samples skipped ({2 * epoch} replacements), the limit '
                f'of 2 bad samples (max_fraction=0.01 of 200 samples).') in log
    meta = checkpoint_meta(tmp_path / 'full' / 'epoch_3.pth')['bad_samples']
    assert meta['count'] == 2 and meta['replacements'] == 6 and [f[0] for f in meta['files']] == sorted(bad)
    reference = read_losses(tmp_path / 'full')
    assert sorted(reference) == list(range(30))

    resumed = train_in_process(again, tmp_path / 'resumed', '--resume', str(tmp_path / 'full' / 'epoch_1.pth'))
    assert resumed.code == 0, resumed.output[-4000:]
    after = read_losses(tmp_path / 'resumed')
    assert sorted(after) == list(range(10, 30))
    np.testing.assert_allclose([after[i] for i in range(10, 30)], [reference[i] for i in range(10, 30)],
                               rtol=0, atol=1e-6)
    log = resumed.output
    assert '2 counted so far' in log and 'skipped bad sample' not in log  # the count continues
    assert 'SkipBadSamples after epoch 3: 2 bad samples skipped (6 replacements)' in log


def test_skip_policy_stops_past_the_limit_naming_it(tmp_path):
    # Three bad samples, in the first three batches, so in both data-loader workers (neither reaches the
    # limit alone): the training process counts all three after iteration 3 and stops there.
    from mmengine.registry import RUNNERS
    g = torch.Generator()
    g.manual_seed(0)
    order = torch.randperm(200, generator=g).tolist()
    root = make_list_dataset(str(tmp_path / 'data'), (order[0], order[20], order[40]))
    cfg = Config.fromfile(skip_config(tmp_path / 'cfg.py', root, workers=2, epochs=1, record_losses=False))
    cfg.work_dir = str(tmp_path / 'work')
    runner = RUNNERS.build(cfg)  # the config's runner, which gives the signals back however the run ends
    with pytest.raises(BadSampleLimitExceeded, match=re.escape(
            '3 distinct bad samples exceed the limit of 2 bad samples (max_fraction=0.01 of 200 samples) at '
            'iteration 3; the latest: ') + '.*Fix or remove the files'):
        runner.train()
    assert runner.iter == 2 and not osp.exists(tmp_path / 'work' / 'epoch_1.pth')


@pytest.mark.slow
def test_skip_policy_sums_the_counts_of_ddp_processes(tmp_path):
    bad = first_indices_of_each_rank()  # one bad sample in each process's share of epoch 1
    root = make_list_dataset(str(tmp_path / 'data'), bad)
    cfg = skip_config(tmp_path / 'cfg.py', root, batch_size=10, workers=1, epochs=1, recorder='loss_recorder')
    env = dict(run_env(), PORT=str(free_port()))
    work = tmp_path / 'ddp'
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg, '2', '--work-dir', str(work)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    for i in bad:  # rank 0 logs both, the one of rank 1 too
        assert len(re.findall(rf'skipped bad sample {i}: ', log)) == 1, log[-3000:]
    assert 'SkipBadSamples after epoch 1: 2 bad samples skipped (2 replacements)' in log
    assert checkpoint_meta(work / 'epoch_1.pth')['bad_samples']['count'] == 2
