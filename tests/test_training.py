"""Multi-process training, exact resumption and clear data errors, through the real tools.

Every run is a subprocess of ``tools/train.py`` / ``tools/dist_train.sh`` on a tiny ViT and a
192-image subset of the digits dataset, so these tests exercise exactly what users run.
"""
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from helpers.common import REPO, free_port, read_losses, run_env
from vit_plugin.datasets.digits import prepare_digits_dataset

pytestmark = pytest.mark.slow


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


def test_ddp_two_processes_match_one_process(tmp_path, digits_root):
    # Same global batch (2 x 16 vs 1 x 32), same samples per step (DefaultSampler hands rank r the
    # r-th of every 2 shuffled indices), deterministic data and no dropout: the mean of the two
    # ranks' losses must equal the single process's loss, and the weights must stay equal.
    single = tiny_config(tmp_path / 'single.py', digits_root, batch_size=32, max_epochs=2,
                         deterministic_data=True, drop_rate=0.0)
    double = tiny_config(tmp_path / 'double.py', digits_root, batch_size=16, max_epochs=2,
                         deterministic_data=True, drop_rate=0.0)
    train(single, tmp_path / 'one')
    dist_train(double, tmp_path / 'two')

    one = read_losses(tmp_path / 'one')
    rank0, rank1 = read_losses(tmp_path / 'two', 0), read_losses(tmp_path / 'two', 1)
    assert sorted(one) == sorted(rank0) == sorted(rank1) == list(range(12))  # 2 epochs x 6 steps
    mean_two = np.array([(rank0[i] + rank1[i]) / 2 for i in sorted(one)])
    single_losses = np.array([one[i] for i in sorted(one)])
    assert not np.allclose(np.array([rank0[i] for i in sorted(one)]), single_losses, atol=1e-3)  # halves differ
    np.testing.assert_allclose(mean_two, single_losses, rtol=0, atol=2e-5)
    assert single_losses[-1] < single_losses[0]

    w1, w2 = final_weights(tmp_path / 'one'), final_weights(tmp_path / 'two')
    assert set(w1) == set(w2)
    for key in w1:
        np.testing.assert_allclose(w2[key].float().numpy(), w1[key].float().numpy(), rtol=0, atol=1e-4,
                                   err_msg=key)


def test_ddp_ranks_draw_their_own_masks_and_resume_exactly(tmp_path, digits_root):
    # Deterministic data, so that nothing but the seeds could make the ranks' random streams differ;
    # dropout on. Each rank must drop other entries than the other rank at every step (one global
    # batch, not two copies of one rank's masks), and a run resumed from the epoch-1 checkpoint
    # must repeat every rank's masks and losses of epoch 2.
    cfg = tiny_config(tmp_path / 'cfg.py', digits_root, batch_size=16, max_epochs=2, deterministic_data=True)
    dist_train(cfg, tmp_path / 'full')
    masks = [read_dropout(tmp_path / 'full', rank) for rank in (0, 1)]
    losses = [read_losses(tmp_path / 'full', rank) for rank in (0, 1)]
    assert sorted(masks[0]) == sorted(masks[1]) == sorted(losses[0]) == list(range(12))
    for step in range(12):
        assert masks[0][step][0] != masks[1][step][0], step
        assert all(0.05 < m[step][1] < 0.15 for m in masks)  # drop_rate 0.1: the masks are real
    assert len({digest for m in masks for digest, _ in m.values()}) == 24  # and new at every step

    dist_train(cfg, tmp_path / 'resumed', '--resume', str(tmp_path / 'full' / 'epoch_1.pth'))
    for rank in (0, 1):
        after = read_losses(tmp_path / 'resumed', rank)
        assert sorted(after) == list(range(6, 12))
        assert read_dropout(tmp_path / 'resumed', rank) == {i: masks[rank][i] for i in range(6, 12)}
        np.testing.assert_allclose([after[i] for i in range(6, 12)], [losses[rank][i] for i in range(6, 12)],
                                   rtol=0, atol=1e-6)


def test_killed_run_resumes_exactly(tmp_path, digits_root):
    # Dropout and random crops on: reproducing the losses requires the random streams to be
    # restored too (vit_plugin.RNGReseedHook), not only the weights and optimizer state.
    cfg = tiny_config(tmp_path / 'cfg.py', digits_root, batch_size=32, max_epochs=3)
    train(cfg, tmp_path / 'full')
    reference = read_losses(tmp_path / 'full')
    assert sorted(reference) == list(range(18))

    work = tmp_path / 'killed'
    cmd = [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg, '--work-dir', str(work)]
    proc = subprocess.Popen(cmd, env=run_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 240
    try:
        while not osp.exists(work / 'last_checkpoint'):  # written once epoch_1.pth is complete
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.time() < deadline, 'no checkpoint within 240 s'
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not osp.exists(work / 'epoch_3.pth')  # really interrupted before the end

    resumed = train(cfg, work, '--resume')
    assert 'resumed' in (resumed.stdout + resumed.stderr).lower()
    after = read_losses(work)
    first = min(after)
    assert first in (6, 12)  # resumed at an epoch boundary (6 iterations per epoch)
    assert sorted(after) == list(range(first, 18))
    np.testing.assert_allclose([after[i] for i in sorted(after)], [reference[i] for i in sorted(after)],
                               rtol=0, atol=1e-6)
    masks = read_dropout(tmp_path / 'full', 0)
    assert read_dropout(work, 0) == {i: masks[i] for i in sorted(after)}


def test_missing_data_root_gives_clear_error(tmp_path):
    missing = tmp_path / 'no' / 'imagenet21k'
    cmd = [sys.executable, osp.join(REPO, 'tools', 'train.py'), osp.join(REPO, 'configs', 'vit_b16_in21k.py'),
           '--work-dir', str(tmp_path / 'w'), '--cfg-options', f'train_dataloader.dataset.data_root={missing}',
           'model.backbone.arch=ti', 'model.head.in_channels=192', 'model.head.hidden_dim=192',
           'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False']
    proc = subprocess.run(cmd, env=run_env(), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert str(missing) in proc.stderr
    assert 'Data preparation' in proc.stderr and 'README' in proc.stderr
    assert 'meta/train.txt' in proc.stderr  # the expected layout is shown
    assert 'Traceback' not in proc.stderr


# ---------------------------------------------------------------- data and batch bookkeeping
def test_digits_dataset_is_complete_deterministic_and_idempotent(tmp_path):
    import hashlib
    from sklearn.datasets import load_digits

    root = prepare_digits_dataset(str(tmp_path / 'digits'))
    files = sorted(p for p in glob_png(root))
    assert len(files) == 1797
    targets = load_digits().target
    counts = {'train': 0, 'test': 0}
    for path in files:  # <root>/<split>/<class>/<sklearn index>.png
        split, cls, name = path.split(os.sep)[-3:]
        assert int(cls) == targets[int(name[:-4])]
        counts[split] += 1
    assert counts == {'train': 1438, 'test': 359}
    digest = hashlib.sha256(b''.join(open(p, 'rb').read() for p in files)).hexdigest()
    mtime = os.stat(files[0]).st_mtime_ns
    assert prepare_digits_dataset(root) == root and os.stat(files[0]).st_mtime_ns == mtime  # reused
    other = prepare_digits_dataset(str(tmp_path / 'again'))
    again = sorted(glob_png(other))
    assert hashlib.sha256(b''.join(open(p, 'rb').read() for p in again)).hexdigest() == digest

    from PIL import Image
    img = np.asarray(Image.open(files[0]))
    assert img.shape == (32, 32) and img.max() > 200  # enlarged, and scaled from 0..16 to 0..255


def glob_png(root):
    import glob
    return glob.glob(osp.join(root, '*', '*', '*.png'))


@pytest.mark.parametrize('type_,kwargs,needle', [
    ('ImageNet21k', dict(ann_file='meta/train.txt', data_prefix='train'), 'meta/train.txt'),
    ('ImageNet', dict(split='val'), 'meta/{train,val}.txt'),
    ('OxfordIIITPet', dict(split='test'), 'annotations/{trainval,test}.txt'),
    ('Flowers102', dict(split='test'), 'setid.mat'),
    ('CIFAR10', dict(split='test', download=False), 'cifar-10-batches-py'),
])
def test_missing_dataset_files_name_the_path(tmp_path, type_, kwargs, needle):
    from mmengine.registry import DATASETS

    from vit_plugin.datasets import DataRootNotFoundError
    missing = tmp_path / 'nowhere'
    with pytest.raises(DataRootNotFoundError) as err:
        DATASETS.build(dict(type=f'vit_plugin.{type_}', data_root=str(missing), **kwargs))
    message = str(err.value)
    assert str(missing) in message and needle in message and "'Data preparation'" in message


def test_partial_dataset_names_the_missing_file(tmp_path):
    from vit_plugin.datasets import DataRootNotFoundError
    from vit_plugin.datasets.checked import ImageNet21k
    (tmp_path / 'train').mkdir()
    with pytest.raises(DataRootNotFoundError, match=str(tmp_path / 'meta' / 'train.txt')):
        ImageNet21k(data_root=str(tmp_path), ann_file='meta/train.txt', data_prefix='train')


def test_global_batch_becomes_accumulation_and_rescaled_counts():
    from mmengine.config import Config

    from vit_plugin.engine.global_batch import apply_global_batch_size
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_l16_in21k_ft_in1k_384.py'))
    cfg.train_dataloader.batch_size = 16
    assert apply_global_batch_size(cfg, world_size=8) == 4  # 512 = 16 x 8 x 4
    assert cfg.optim_wrapper.accumulative_counts == 4
    assert cfg.train_cfg.max_iters == 80000 and cfg.train_cfg.val_interval == 80000
    warmup, cosine = cfg.param_scheduler
    assert (warmup.begin, warmup.end, cosine.begin, cosine.end) == (0, 2000, 2000, 80000)
    assert cfg.default_hooks.checkpoint.interval == 80000 and cfg.default_hooks.logger.interval == 200
    assert cfg.custom_hooks[0].interval == 4  # the EMA moves once per optimizer step

    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_l16_in21k.py'))
    with pytest.raises(ValueError, match='not a multiple of batch_size=32 x 3 processes'):
        apply_global_batch_size(cfg, world_size=3)
    cfg.global_batch_size = None
    assert apply_global_batch_size(cfg, world_size=3) == 1 and cfg.train_cfg.max_iters == 312000


def test_fsdp_wraps_one_unit_per_transformer_block():
    from mmengine.registry import FUNCTIONS

    from vit_plugin.models.backbones.vit import ViT
    from vit_plugin.models.layers import EncoderBlock
    policy = FUNCTIONS.get('vit_plugin.vit_block_wrap_policy')  # how vit_plugin.FSDP2Strategy finds it
    model = ViT(arch=dict(embed_dims=32, num_layers=3, num_heads=2, mlp_dims=64), img_size=32, patch_size=8)
    wrapped = [name for name, m in model.named_modules() if policy(m, recurse=False, nonwrapped_numel=0)]
    assert wrapped == ['blocks.0', 'blocks.1', 'blocks.2']
    assert all(policy(m, recurse=True, nonwrapped_numel=0) for m in model.modules())
    assert all(isinstance(model.get_submodule(n), EncoderBlock) for n in wrapped)



@pytest.mark.parametrize('ending, status', [('return', 0), ('raise SystemExit(75)', 75), ("raise SystemExit('stop')", 1)])
def test_a_rank_that_finished_exits_with_the_runs_status(tmp_path, ending, status):
    """``run_as_script`` (tools/train.py, tools/test.py): a process that was part of a process group exits
    with the run's status and its output flushed, also on the path that skips the interpreter's teardown."""
    import subprocess
    import sys
    script = tmp_path / 'rank.py'
    script.write_text(f"""
import torch.distributed as dist
from vit_plugin.apis.launch import release_process_group, run_as_script
def main():
    dist.init_process_group('gloo', init_method='file://{tmp_path / "store"}', rank=0, world_size=1)
    print('trained', flush=False)
    release_process_group()
    {ending}
run_as_script(main)
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith('trained')
    assert ('stop' in proc.stderr) == (status == 1)
