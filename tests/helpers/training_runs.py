"""Training runs of ``tools/train.py`` / ``tools/dist_train.sh`` as subprocesses, for the tests of
pre-emption, SLURM, FSDP2, compiled and multi-process training: a small iteration-based and a small
epoch-based digits config, the commands, waiting for a run's progress before signalling it, and
reading what a run recorded."""
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import torch

from helpers.common import REPO, free_port, run_env

MAX_ITERS = 24
INTERVAL = 8  # checkpoints at 8, 16, 24


def iter_config(path, data_root, *, delay=0.0, batch_size=32, drop_rate=0.1, num_workers=0):
    """configs/vit_demo_digits.py as a 24-iteration, iteration-based run with checkpoints every 8
    iterations; every rank records its losses (loss_recorder.py) and its progress (pacing.py).

    Dropout is on (a resumed run must restore the random streams) but the images are not augmented:
    an iteration-based loop loads each batch before ``RNGReseedHook`` reseeds the iteration, so
    host-side augmentations of the first resumed batch are drawn from another stream state.
    """
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports=['vit_plugin', 'loss_recorder', 'pacing'], allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64), drop_rate={drop_rate}),
             head=dict(in_channels=32))
train_dataloader = dict(batch_size={batch_size}, num_workers={num_workers}, persistent_workers=False,
                        sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
                        dataset=dict(data_root={data_root!r}, indices=192, pipeline={{{{_base_.test_pipeline}}}}))
val_dataloader = dict(num_workers=0, dataset=dict(data_root={data_root!r}, indices=64))
test_dataloader = val_dataloader
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4),
                   dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=4, end={MAX_ITERS})]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={MAX_ITERS}, val_interval=1000)
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(by_epoch=False, interval={INTERVAL}, max_keep_ckpts=5))
custom_hooks = [dict(type='LossRecorderHook'), dict(type='PacingHook', delay={delay})]
""")
    return str(path)


def train_cmd(cfg, work_dir, *extra):
    return [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg, '--work-dir', str(work_dir), *extra]


def dist_cmd(cfg, work_dir, *extra, procs=2):
    return ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg, str(procs), '--work-dir', str(work_dir), *extra]


def run(cmd, env=None, expect=0):
    proc = subprocess.run(cmd, env=env or run_env(), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == expect, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def progress(work_dir, rank=0):
    """(finished iterations, process id) of ``rank``, as written by pacing.py, or (0, None)."""
    try:
        with open(osp.join(work_dir, f'progress_rank{rank}')) as f:
            done, pid = f.read().split()
    except (FileNotFoundError, ValueError):
        return 0, None
    return int(done), int(pid)


def signal_when(proc, work_dir, after_iters, target=None, signum=signal.SIGTERM, rank=0):
    """Wait until ``rank`` finished ``after_iters`` iterations, then send ``signum`` to ``target``:
    'worker' (the process of ``rank``), 'group' (every process of ``proc``'s process group) or, by default,
    ``proc`` itself; returns the subprocess's exit status and its output."""
    deadline = time.time() + 240
    while True:
        done, pid = progress(work_dir, rank)
        if done >= after_iters:
            break
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.time() < deadline, f'{work_dir}: fewer than {after_iters} iterations in 240 s'
        time.sleep(0.02)
    if target == 'group':
        os.killpg(proc.pid, signum)
    else:
        os.kill(pid if target == 'worker' else proc.pid, signum)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out + err


def losses_list(losses, iters):
    return [losses[i] for i in iters]


def tiny_config(path, data_root, *, batch_size, max_epochs, deterministic_data=False, drop_rate=0.1):
    """A test override of configs/vit_demo_digits.py: a 2-block ViT on 192 digits; every rank records
    its losses (loss_recorder.py) and the masks of the dropout after the position embedding
    (dropout_recorder.py)."""
    pipeline = "{{_base_.test_pipeline}}" if deterministic_data else "{{_base_.train_pipeline}}"
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports=['vit_plugin', 'loss_recorder', 'dropout_recorder'], allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64),
                           drop_rate={drop_rate}),
             head=dict(in_channels=32))
train_dataloader = dict(batch_size={batch_size}, num_workers=0, persistent_workers=False,
                        sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
                        dataset=dict(data_root={data_root!r}, indices=192, pipeline={pipeline}))
val_dataloader = dict(num_workers=0, dataset=dict(data_root={data_root!r}, indices=64))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs={max_epochs}, val_interval=1000)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=5))
custom_hooks = [dict(type='LossRecorderHook')] + (
    [dict(type='DropoutMaskRecorderHook')] if {drop_rate} > 0 else [])
""")
    return str(path)


def train(cfg, work_dir, *extra, timeout=300):
    cmd = [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg, '--work-dir', str(work_dir), *extra]
    proc = subprocess.run(cmd, env=run_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def dist_train(cfg, work_dir, *extra, procs=2, timeout=300):
    """``tools/dist_train.sh`` with ``procs`` CPU processes (Gloo)."""
    env = dict(run_env(), PORT=str(free_port()))
    cmd = ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg, str(procs), '--work-dir', str(work_dir), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def read_dropout(work_dir, rank):
    """Iteration -> (mask digest, fraction dropped), as written by dropout_recorder.py."""
    with open(osp.join(work_dir, f'dropout_rank{rank}.json')) as f:
        return {int(k): tuple(v) for k, v in json.load(f).items()}


def final_weights(work_dir):
    with open(osp.join(work_dir, 'last_checkpoint')) as f:  # a path relative to the work dir, or absolute
        ckpt = torch.load(osp.join(work_dir, f.read().strip()), map_location='cpu', weights_only=False)
    return ckpt['state_dict']
