"""``tools/train.py CONFIG --dry-run``: the run plan and each change it makes to the config, for 1 and for
4 processes, printed without building a model or loading data."""
import os.path as osp

import pytest
from mmengine.config import Config

from helpers.common import REPO

CLS = osp.join(REPO, 'configs', 'vit_l16_in21k.py')  # global batch 4096, 32 per device
DET = osp.join(REPO, 'configs', 'mask_rcnn_vit_b16_simplefpn_1x_coco.py')


@pytest.fixture
def dry_run(monkeypatch, capsys):
    """``tools/train.py ARGS --dry-run`` in this process: its output; building a model, a dataset or a
    runner fails the test."""
    from mmengine.dataset import DefaultSampler
    import vit_plugin.cli.launch as launch
    from vit_plugin.cli import train
    from vit_plugin.models import ViT

    def built(*args, **kwargs):
        raise AssertionError('--dry-run built something')

    for owner, name in ((ViT, '__init__'), (DefaultSampler, '__init__'), (launch, 'build_runner'),
                        (train, 'run_training')):
        monkeypatch.setattr(owner, name, built)

    def run(*argv):
        train.main([*argv, '--dry-run', '--work-dir', '/nonexistent'])
        return capsys.readouterr().out
    return run


@pytest.mark.parametrize('nproc', [1, 4])
def test_dry_run_prints_the_plan_of_a_classification_config(dry_run, nproc):
    k = 4096 // (32 * nproc)
    out = dry_run(CLS, '--launcher', 'pytorch', '--nproc', str(nproc))
    assert f"Run plan: {nproc} process(es), launcher 'pytorch'" in out
    assert f'accumulation: {k} micro-batch(es) per optimizer step' in out
    assert f'[global batch] optim_wrapper.accumulative_counts: <absent> -> {k}' in out
    assert f'[global batch] train_cfg.max_iters: 312000 -> {312000 * k}' in out


@pytest.mark.parametrize('nproc', [1, 4])
def test_dry_run_prints_the_plan_of_a_detection_config(dry_run, nproc):
    per_device = Config.fromfile(DET).train_dataloader.batch_size
    k = 64 // (per_device * nproc)
    out = dry_run(DET, '--launcher', 'pytorch', '--nproc', str(nproc), '--cfg-options', 'global_batch_size=64')
    assert f"Run plan: {nproc} process(es), launcher 'pytorch'" in out
    assert f'[global batch] optim_wrapper.accumulative_counts: <absent> -> {k}' in out
    assert "[preemption] default_hooks.checkpoint: {'type': 'CheckpointHook'" in out  # mmdet's, made atomic
    assert '[preemption] default_hooks.preemption: <absent> -> ' in out


def test_nproc_goes_with_dry_run():
    from vit_plugin.cli import train
    with pytest.raises(SystemExit):
        train.parse_args([CLS, '--nproc', '4'])
