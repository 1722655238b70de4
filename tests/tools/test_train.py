"""``tools/train.py`` end to end: a killed run resumes exactly, a missing data root is a clear error, and
``--compile`` (mmengine's ``compile`` option: the runner compiles ``train_step`` with Inductor) trains and
resumes with the uninterrupted compiled run's losses."""
import os
import os.path as osp
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers.common import REPO, read_losses, run_env
from helpers.in_process import train_in_process
from helpers.subprocess_like import like_a_subprocess
from helpers.training_runs import iter_config, read_dropout, run, tiny_config, train, train_cmd

pytestmark = pytest.mark.slow


def test_compiled_training_resumes_with_the_same_losses(tmp_path, digits_root):
    cfg = iter_config(tmp_path / 'cfg.py', digits_root)  # with dropout, no augmentation
    # a 1-block ViT, and no validation: what Inductor compiles is one training step's graphs
    options = ['--no-validate', '--cfg-options', 'train_cfg.max_iters=6', 'default_hooks.checkpoint.interval=3',
               'model.backbone.arch.num_layers=1']
    env = dict(run_env(), TORCHINDUCTOR_COMPILE_THREADS='1')  # no pool of compile workers to start
    full = tmp_path / 'full'
    proc = run(train_cmd(cfg, full, '--compile', *options), env=env)
    assert 'Model has been "compiled"' in proc.stdout + proc.stderr
    losses = read_losses(full)
    assert sorted(losses) == list(range(6)) and all(np.isfinite(list(losses.values())))

    resumed = tmp_path / 'resumed'  # a new work dir that continues from the full run's iteration 3
    resumed.mkdir()
    shutil.copy(full / 'iter_3.pth', resumed / 'iter_3.pth')
    run(train_cmd(cfg, resumed, '--compile', '--resume', str(resumed / 'iter_3.pth'), *options), env=env)
    after = read_losses(resumed)
    assert sorted(after) == [3, 4, 5]
    np.testing.assert_allclose([after[i] for i in (3, 4, 5)], [losses[i] for i in (3, 4, 5)], rtol=0, atol=1e-5)


# Dropout and random crops on: reproducing the losses requires the random streams to be restored too
# (vit_plugin.RNGReseedHook), not only the weights and optimizer state. The uninterrupted run and the
# killed-then-resumed one are module-scoped fixtures, each run once; each test checks one claim. The
# uninterrupted run trains in the test process, with one thread like the subprocesses.
@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, digits_root):
    """A 3-epoch run with dropout and random crops: its config and work dir."""
    root = tmp_path_factory.mktemp('killed_run')
    cfg = tiny_config(root / 'cfg.py', digits_root, batch_size=32, max_epochs=3)
    with like_a_subprocess('loss_recorder', 'dropout_recorder'):
        outcome = train_in_process(cfg, root / 'full')
    assert outcome.code == 0, outcome.output[-4000:]
    return cfg, root / 'full'


@pytest.fixture(scope='module')
def killed(uninterrupted):
    """The same run killed (SIGKILL to its process group) once its first checkpoint is complete."""
    cfg, full = uninterrupted
    work = full.parent / 'killed'
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
    return work


@pytest.fixture(scope='module')
def resumed(uninterrupted, killed):
    """``--resume`` of the killed run: its output."""
    cfg, _ = uninterrupted
    return train(cfg, killed, '--resume')


def test_uninterrupted_run_records_every_iteration(uninterrupted):
    _, full = uninterrupted
    assert sorted(read_losses(full)) == list(range(18))


def test_killed_run_stopped_before_the_end(killed):
    assert not osp.exists(killed / 'epoch_3.pth')  # really interrupted before the end


def test_killed_run_resumes_at_an_epoch_boundary(killed, resumed):
    assert 'resumed' in (resumed.stdout + resumed.stderr).lower()
    after = read_losses(killed)
    first = min(after)
    assert first in (6, 12)  # resumed at an epoch boundary (6 iterations per epoch)
    assert sorted(after) == list(range(first, 18))


def test_killed_run_resumes_exactly(uninterrupted, killed, resumed):
    _, full = uninterrupted
    reference, after = read_losses(full), read_losses(killed)
    np.testing.assert_allclose([after[i] for i in sorted(after)], [reference[i] for i in sorted(after)],
                               rtol=0, atol=1e-6)


def test_killed_run_resumes_the_dropout_masks(uninterrupted, killed, resumed):
    _, full = uninterrupted
    masks = read_dropout(full, 0)
    assert read_dropout(killed, 0) == {i: masks[i] for i in sorted(read_losses(killed))}


def test_missing_data_root_gives_clear_error(tmp_path):
    """``tools/train.py``'s ``main`` in this process: exit status 2 and the message, no traceback (the exit
    status of ``run_as_script``, which ``tools/train.py`` runs ``main`` under: tests/cli/test_launch.py)."""
    missing = tmp_path / 'no' / 'imagenet21k'
    outcome = train_in_process(
        osp.join(REPO, 'configs', 'vit_b16_in21k.py'), tmp_path / 'w', '--cfg-options',
        f'train_dataloader.dataset.data_root={missing}', 'model.backbone.arch=ti', 'model.head.in_channels=192',
        'model.head.hidden_dim=192', 'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False')
    assert outcome.code == 2, outcome.output[-3000:]
    assert str(missing) in outcome.output
    assert 'Data preparation' in outcome.output and 'README' in outcome.output
    assert 'meta/train.txt' in outcome.output  # the expected layout is shown
    assert 'Traceback' not in outcome.output
