"""``tools/train.py --vis``: a run writes its scalars to TensorBoard as it trains (the same values, step for step,
as ``scalars.json``), only rank 0 writes, a backend whose package is missing stops the run before anything is
built, and ``tools/analysis/plot_curves.py`` draws a run from its event file. One shared 4-iteration run."""
import glob
import importlib.util
import json
import os.path as osp

import numpy as np
import pytest
from helpers.common import REPO
from helpers.training_runs import train
from mmengine.config import Config

from vit_plugin.cli import plot_curves
from vit_plugin.cli.train import main as train_main
from vit_plugin.cli.train import merge_args, parse_args

MAX_ITERS = 4


@pytest.fixture(scope='module')
def vis_config(tmp_path_factory, digits_root):
    """configs/vit_demo_digits.py as a 2-block ViT trained 4 iterations on 64 digits, validated after the 4th."""
    path = tmp_path_factory.mktemp('vis') / 'cfg.py'
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)),
             head=dict(in_channels=32))
train_dataloader = dict(batch_size=16, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root={digits_root!r}, indices=64, pipeline={{{{_base_.test_pipeline}}}}))
val_dataloader = dict(batch_size=32, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root={digits_root!r}, indices=32))
test_dataloader = val_dataloader
param_scheduler = [dict(type='mmengine.LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3)]
train_cfg = dict(_delete_=True, type='mmengine.IterBasedTrainLoop', max_iters={MAX_ITERS}, val_interval={MAX_ITERS})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=1000))
""")
    return str(path)


@pytest.fixture(scope='module')
def vis_run(vis_config):
    """The work dir of ``tools/train.py CONFIG --vis tensorboard``."""
    work_dir = osp.join(osp.dirname(vis_config), 'work')
    train(vis_config, work_dir, '--vis', 'tensorboard')
    return work_dir


def _scalars_json(work_dir):
    (path, ) = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _events(work_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    (path, ) = glob.glob(osp.join(work_dir, '*', 'vis_data', 'events.out.tfevents.*'))
    events = EventAccumulator(path, size_guidance={'scalars': 0})
    events.Reload()
    return events


@pytest.mark.slow
def test_the_event_file_holds_the_losses_and_learning_rates_of_scalars_json(vis_run):
    records = _scalars_json(vis_run)
    events = _events(vis_run)
    for key in ('loss', 'lr'):
        expected = [(r['step'], np.float32(r[key])) for r in records if key in r]
        assert [step for step, _ in expected] == list(range(1, MAX_ITERS + 1))
        assert [(e.step, np.float32(e.value)) for e in events.Scalars(key)] == expected, key


@pytest.mark.slow
def test_the_dashboard_gets_every_training_and_validation_scalar(vis_run):
    events = _events(vis_run)
    tags = set(events.Tags()['scalars'])
    assert {'loss', 'lr', 'grad_norm', 'data_time', 'skipped_steps', 'accuracy/top1'} <= tags, tags
    (top1, ) = events.Scalars('accuracy/top1')
    assert top1.step == MAX_ITERS  # at the iteration, on the axis of the training scalars


@pytest.mark.slow
def test_plot_curves_draws_the_run_from_its_event_file(vis_run, tmp_path, capsys):
    out = tmp_path / 'curves.png'
    plot_curves.main([vis_run, '--source', 'events', '--out', str(out), '--keys', 'loss', 'lr', 'accuracy/top1',
                      'no_such_key'])
    assert 'loss, lr, accuracy/top1 of 1 run(s)' in capsys.readouterr().out
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    from_events, from_json = plot_curves.read_event_scalars(vis_run), plot_curves.read_scalars_json(vis_run)
    np.testing.assert_allclose(np.array(from_events['loss']), np.array(from_json['loss']), rtol=1e-6)


def test_vis_adds_each_backend_once_after_local(vis_config):
    cfg = merge_args(Config.fromfile(vis_config),
                     parse_args([vis_config, '--vis', 'tensorboard', 'wandb', 'mlflow', 'tensorboard']))
    assert [b['type'] for b in cfg.visualizer.vis_backends] == [
        'LocalVisBackend', 'TensorboardVisBackend', 'WandbVisBackend', 'MLflowVisBackend']


def test_only_rank_zero_writes(tmp_path, monkeypatch):
    import mmengine.dist.utils as dist_utils
    from mmengine.visualization import TensorboardVisBackend, Visualizer
    for rank in (1, 0):
        monkeypatch.setattr(dist_utils, 'get_rank', lambda group=None, rank=rank: rank)
        visualizer = Visualizer(name=f'vis_rank{rank}', save_dir=str(tmp_path / f'rank{rank}'),
                                vis_backends=[dict(type=TensorboardVisBackend)])
        visualizer.add_scalars({'loss': 1.0}, step=1)
        visualizer.close()
    assert not glob.glob(str(tmp_path / 'rank1' / '**' / 'events.out.tfevents.*'), recursive=True)
    assert glob.glob(str(tmp_path / 'rank0' / '**' / 'events.out.tfevents.*'), recursive=True)


def test_a_missing_backend_package_stops_the_run_before_anything_is_built(vis_config, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *args: None if name.split('.')[0] == 'tensorboard' else real(name, *args))
    work_dir = tmp_path / 'work'
    with pytest.raises(SystemExit) as stop:
        train_main([vis_config, '--work-dir', str(work_dir), '--vis', 'tensorboard'])
    message = str(stop.value.code)
    assert "TensorboardVisBackend needs 'tensorboard'" in message and 'pip install tensorboard' in message
    assert len(message.splitlines()) <= 3
    assert not work_dir.exists()  # no runner was built: no log, no checkpoint, no iteration
