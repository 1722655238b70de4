"""Pre-emption-safe training: SIGTERM / SIGUSR1 stop a run with a checkpoint, checkpoints are written
atomically, and ``--resume`` finds the newest intact checkpoint of the work dir it is given.

The end-to-end tests run ``tools/train.py`` / ``tools/dist_train.sh`` as subprocesses on a 2-block ViT
and 192 digits with an iteration-based loop (as the paper's configs use), and compare losses with
an uninterrupted run of the same config.
"""
import os
import os.path as osp
import shutil
import signal
import struct
import subprocess
import time
import zipfile

import numpy as np
import pytest
import torch

from helpers.common import REPO, free_port, read_losses, run_env
from helpers.training_runs import (INTERVAL, MAX_ITERS, dist_cmd, iter_config, losses_list, progress, run, signal_when,
                                    train_cmd)
from vit_plugin.engine.checkpointing import (AtomicCheckpointHook, atomic_write_bytes, checkpoint_problem,
                                             find_resumable_checkpoint, read_last_checkpoint,
                                             write_last_checkpoint)
from vit_plugin.engine.preemption import EXIT_PREEMPTED


@pytest.fixture(scope='module')
def reference(tmp_path_factory, digits_root):
    """An uninterrupted single-process run: its config, work dir and per-iteration losses."""
    root = tmp_path_factory.mktemp('preemption')
    cfg = iter_config(root / 'cfg.py', digits_root)
    work = root / 'full'
    run(train_cmd(cfg, work))
    losses = read_losses(work)
    assert sorted(losses) == list(range(MAX_ITERS))
    return dict(cfg=cfg, work=work, losses=losses, root=root)


def children(pid):
    """Process ids of the direct children of ``pid`` (Linux /proc)."""
    found = []
    for task in os.listdir(f'/proc/{pid}/task'):
        with open(f'/proc/{pid}/task/{task}/children') as f:
            found += [int(c) for c in f.read().split()]
    return found


def gone(pids, timeout=10.0):
    """Whether all ``pids`` have exited within ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(osp.exists(f'/proc/{pid}') for pid in pids):
            return True
        time.sleep(0.05)
    return False


def stop_the_whole_job(cfg, work, after_iters, signum, *extra):
    """Start ``tools/train.py cfg`` (with ``extra`` arguments) in its own process group, send ``signum``
    to the whole group once ``after_iters`` iterations are done and check the stop: exit status 75, a
    message naming the signal and ``--resume``, no worker complaint, the workers gone, and an intact
    checkpoint of the last finished iteration named in ``last_checkpoint``. Returns (losses of the run,
    iteration it stopped after, its output)."""
    if osp.exists(work / 'progress_rank0'):
        os.remove(work / 'progress_rank0')  # a previous run's progress
    proc = subprocess.Popen(train_cmd(cfg, work, *extra), env=run_env(), cwd=REPO, text=True,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while progress(work)[0] < after_iters - 1:  # the workers exist once training runs
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        time.sleep(0.02)
    workers = children(proc.pid)
    assert len(workers) >= 2, workers
    status, output = signal_when(proc, work, after_iters=after_iters, target='group', signum=signum)
    assert status == EXIT_PREEMPTED, output[-4000:]
    assert signal.Signals(signum).name in output and '--resume' in output and 'Traceback' not in output
    assert 'DataLoader worker' not in output and 'killed by signal' not in output
    assert gone(workers), 'data-loader workers outlived the run'

    losses = read_losses(work)  # after_train hooks ran: the loss recorder wrote its file
    stopped = max(losses) + 1
    assert stopped < MAX_ITERS and osp.isfile(work / f'iter_{stopped}.pth')
    assert checkpoint_problem(str(work / f'iter_{stopped}.pth')) is None
    assert (work / 'last_checkpoint').read_text() == f'iter_{stopped}.pth'  # relative to the work dir
    ckpt = torch.load(work / f'iter_{stopped}.pth', map_location='cpu', weights_only=False)
    assert ckpt['meta']['iter'] == stopped
    assert not [name for name in os.listdir(work) if name.endswith('.part')]
    return losses, stopped, output


@pytest.mark.slow
def test_signals_to_the_whole_job_save_stop_and_resume_repeats_the_losses(reference, tmp_path, digits_root):
    # What SLURM does on pre-emption or scancel (SIGTERM; `scancel --signal=USR1`, `--signal=USR1@120`):
    # the signal reaches every process of the job, the training process and its two data-loader
    # workers. The workers must keep serving batches until the run has saved and stopped, and then end
    # cleanly. The run is paced (0.3 s per iteration) so that each signal lands between two checkpoints:
    # SIGTERM stops the first run, SIGUSR1 the run resumed from its checkpoint, and a third run finishes.
    # Together they must give the uninterrupted run's losses.
    cfg = iter_config(tmp_path / 'paced.py', digits_root, delay=0.3, num_workers=2)
    work = tmp_path / 'run'
    first, stopped, _ = stop_the_whole_job(cfg, work, INTERVAL + 2, signal.SIGTERM)
    assert sorted(first) == list(range(stopped)) and INTERVAL + 2 <= stopped < 2 * INTERVAL

    second, stopped_again, output = stop_the_whole_job(cfg, work, 2 * INTERVAL + 2, signal.SIGUSR1, '--resume')
    assert f'iter_{stopped}.pth' in output
    assert sorted(second) == list(range(stopped, stopped_again)) and 2 * INTERVAL + 2 <= stopped_again

    resumed = run(train_cmd(cfg, work, '--resume'))
    assert f'iter_{stopped_again}.pth' in resumed.stdout + resumed.stderr
    third = read_losses(work)
    assert sorted(third) == list(range(stopped_again, MAX_ITERS))
    for losses in (first, second, third):
        np.testing.assert_allclose(losses_list(losses, sorted(losses)),
                                   losses_list(reference['losses'], sorted(losses)), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_copied_work_dir_resumes_from_its_newest_intact_own_checkpoint(reference, tmp_path):
    # A copy of a finished run whose newest checkpoint got truncated (as a full disk or a killed copy
    # leaves it), and whose last_checkpoint is the absolute path mmengine's own CheckpointHook writes:
    # it names the original's intact iter_24.pth. --resume must skip the copy's damaged file with a
    # warning naming it and continue from the copy's own iter_16.pth, not from the original's files.
    original = reference['work']
    copy = tmp_path / 'copy'
    shutil.copytree(original, copy)
    newest = copy / f'iter_{MAX_ITERS}.pth'
    data = newest.read_bytes()
    newest.write_bytes(data[:len(data) // 2])
    (copy / 'last_checkpoint').write_text(str(original / f'iter_{MAX_ITERS}.pth'))
    os.remove(copy / 'losses_rank0.json')

    proc = run(train_cmd(reference['cfg'], copy, '--resume'))
    output = proc.stdout + proc.stderr
    assert f'skips checkpoint {newest}: it is truncated' in output
    assert f'Load checkpoint from {copy / f"iter_{2 * INTERVAL}.pth"}' in output
    after = read_losses(copy)
    assert sorted(after) == list(range(2 * INTERVAL, MAX_ITERS))
    np.testing.assert_allclose(losses_list(after, sorted(after)),
                               losses_list(reference['losses'], sorted(after)), rtol=0, atol=1e-6)
    assert (copy / 'last_checkpoint').read_text() == f'iter_{MAX_ITERS}.pth'
    assert checkpoint_problem(str(newest)) is None  # rewritten whole by the resumed run


def test_last_checkpoint_is_relative_and_resolves_in_a_moved_work_dir(tmp_path):
    work = tmp_path / 'a'
    work.mkdir()
    (work / 'iter_3.pth').write_bytes(b'x')
    write_last_checkpoint(str(work), str(work / 'iter_3.pth'))
    assert (work / 'last_checkpoint').read_text() == 'iter_3.pth'
    moved = tmp_path / 'b'
    shutil.move(str(work), str(moved))
    assert read_last_checkpoint(str(moved)) == str(moved / 'iter_3.pth')
    # A checkpoint outside the work dir (CheckpointHook(out_dir=...)) keeps its absolute path.
    elsewhere = tmp_path / 'store' / 'iter_5.pth'
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b'x')
    write_last_checkpoint(str(moved), str(elsewhere))
    assert read_last_checkpoint(str(moved)) == str(elsewhere)


def _checkpoint_file(path, value):
    torch.save({'state_dict': {'w': torch.full((256, ), float(value))}, 'meta': {'iter': value}}, path)


def test_checkpoint_problem_finds_truncation_and_corruption(tmp_path):
    good = tmp_path / 'iter_1.pth'
    _checkpoint_file(good, 1)
    assert checkpoint_problem(str(good)) is None
    data = good.read_bytes()
    truncated = tmp_path / 'iter_2.pth'
    truncated.write_bytes(data[:-100])
    assert 'truncated' in checkpoint_problem(str(truncated))
    with zipfile.ZipFile(good) as archive:  # flip one byte inside the tensor data record
        info = next(i for i in archive.infolist() if i.filename.endswith('/data/0'))
    # The local header (30 bytes, then name and extra field, whose lengths it stores at bytes 26-29)
    # precedes the data; torch pads the local extra field, so the central directory's copy differs.
    name_len, extra_len = struct.unpack('<HH', data[info.header_offset + 26:info.header_offset + 30])
    offset = info.header_offset + 30 + name_len + extra_len + 10
    corrupted = bytearray(data)
    corrupted[offset] ^= 0xFF
    (tmp_path / 'iter_3.pth').write_bytes(bytes(corrupted))
    assert 'CRC' in checkpoint_problem(str(tmp_path / 'iter_3.pth'))

    warnings = []
    assert find_resumable_checkpoint(str(tmp_path), warn=warnings.append) == str(good)
    assert [w.split(': it')[0] for w in warnings] == [f'WARNING: --resume skips checkpoint {tmp_path / n}'
                                                      for n in ('iter_3.pth', 'iter_2.pth')]
    os.remove(good)
    with pytest.raises(FileNotFoundError, match='no intact checkpoint'):
        find_resumable_checkpoint(str(tmp_path), warn=None)
    assert find_resumable_checkpoint(str(tmp_path / 'empty'), warn=None) is None


def test_interrupted_write_leaves_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / 'iter_8.pth'
    _checkpoint_file(tmp_path / 'source.pth', 8)
    old = (tmp_path / 'source.pth').read_bytes()
    os.remove(tmp_path / 'source.pth')
    atomic_write_bytes(old, str(target))

    def killed(fd):  # the process dies after writing part of the data, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, 'fsync', killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(b'new content that never completes', str(target))
    assert target.read_bytes() == old
    assert osp.isfile(str(target) + '.part')  # the debris has a name --resume never picks
    assert find_resumable_checkpoint(str(tmp_path), warn=None) == str(target)


@pytest.mark.slow
def test_ddp_signal_to_one_process_stops_all_at_the_same_iteration(tmp_path, digits_root):
    # 2 Gloo processes through tools/dist_train.sh; SIGUSR1 reaches only rank 1 (as a scheduler that
    # signals one task would). Both ranks must stop after the same iteration, rank 0 must write that
    # iteration's checkpoint, and --resume must repeat every rank's losses of the uninterrupted run.
    env = dict(run_env(), PORT=str(free_port()))
    full = tmp_path / 'full'
    cfg = iter_config(tmp_path / 'cfg.py', digits_root, batch_size=16)
    run(dist_cmd(cfg, full), env=env)
    reference = [read_losses(full, rank) for rank in (0, 1)]

    paced = iter_config(tmp_path / 'paced.py', digits_root, batch_size=16, delay=0.3)
    work = tmp_path / 'run'
    proc = subprocess.Popen(dist_cmd(paced, work), env=dict(env, PORT=str(free_port())), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status, output = signal_when(proc, work, after_iters=INTERVAL + 2, target='worker', signum=signal.SIGUSR1,
                                 rank=1)
    assert status != 0 and f'exitcode  : {EXIT_PREEMPTED}' in output, output[-4000:]  # torchrun's report
    interrupted = [read_losses(work, rank) for rank in (0, 1)]
    stopped = max(interrupted[0]) + 1
    assert sorted(interrupted[0]) == sorted(interrupted[1]) == list(range(stopped))
    # The processes agree every 10 iterations (PreemptionHook's check_interval), so both stop at the
    # first multiple of 10 at or after rank 1 received the signal (after it finished iteration 10).
    assert stopped % 10 == 0 and INTERVAL + 2 <= stopped <= INTERVAL + 2 + 10, stopped
    assert (work / 'last_checkpoint').read_text() == f'iter_{stopped}.pth'

    run(dist_cmd(cfg, work, '--resume'), env=dict(env, PORT=str(free_port())))
    for rank in (0, 1):
        after = read_losses(work, rank)
        assert sorted(after) == list(range(stopped, MAX_ITERS))
        np.testing.assert_allclose(losses_list(after, sorted(after)), losses_list(reference[rank], sorted(after)),
                                   rtol=0, atol=1e-6)


class _SignalAt:
    """Hook that sends ``signum`` to this process in the middle of training iteration ``at`` (1-based)."""

    def __init__(self, at, signum=signal.SIGTERM):
        from mmengine.hooks import Hook
        self.hook = type('SignalAt', (Hook, ), {
            'before_train_iter': lambda hook, runner, batch_idx, data_batch=None:
                os.kill(os.getpid(), signum) if runner.iter + 1 == at else None})()


class _Validations:
    """Records (iteration, metric) of every validation pass: the mean prediction on fixed inputs, which
    depends on the weights only."""

    def __init__(self):
        from mmengine.evaluator import BaseMetric
        outer = self
        self.passes = []

        class MeanPrediction(BaseMetric):
            def process(self, data_batch, data_samples):
                self.results.extend(float(v) for v in data_samples)

            def compute_metrics(self, results):
                return {'mean': sum(results) / len(results)}

        from mmengine.hooks import Hook

        class Record(Hook):
            def after_val_epoch(self, runner, metrics=None):
                outer.passes.append((runner.iter, round(metrics['mean'], 6)))

        self.metric, self.hook = MeanPrediction(), Record()


def _toy_runner(work_dir, train_cfg, checkpoint, signal_at, validations=None, resume=None):
    """A real mmengine Runner on a linear model, in this process (no subprocess start-up)."""
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, inputs, targets, mode='loss'):
            if mode == 'predict':
                return list(self.fc(inputs).squeeze(1))
            return {'loss': ((self.fc(inputs).squeeze(1) - targets) ** 2).mean()}

    generator = torch.Generator().manual_seed(0)
    data = [dict(inputs=torch.randn(4, generator=generator), targets=torch.randn((), generator=generator))
            for _ in range(8)]
    loader = dict(dataset=data, batch_size=2, sampler=dict(type='DefaultSampler', shuffle=False),
                  collate_fn=dict(type='default_collate'))
    val = {} if validations is None else dict(val_dataloader=loader, val_cfg=dict(),
                                               val_evaluator=[validations.metric])
    torch.manual_seed(0)
    return Runner(
        model=Toy(), work_dir=str(work_dir), train_cfg=train_cfg, train_dataloader=loader,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=dict(checkpoint=dict(type='vit_plugin.AtomicCheckpointHook', **checkpoint),
                           preemption=dict(type='vit_plugin.PreemptionHook'), logger=None),
        custom_hooks=[_SignalAt(signal_at).hook] + ([validations.hook] if validations else []),
        default_scope='mmengine', resume=resume is not None, load_from=resume,
        experiment_name=f'preemption_{osp.basename(str(work_dir))}_{signal_at}_{resume is not None}', **val)


@pytest.mark.parametrize('checkpoint_interval', [6, 100], ids=['checkpoint-hook-saves', 'preemption-hook-saves'])
def test_validation_due_at_the_stop_is_skipped_and_resume_runs_it(tmp_path, checkpoint_interval):
    # Validation every 6 iterations; the signal arrives in iteration 6. The stopping run must not
    # validate (the scheduler's grace period is for the checkpoint); the resumed run validates the
    # iteration-6 weights first, then trains on. Both must see what an uninterrupted run sees.
    import vit_plugin  # noqa: F401
    from vit_plugin.engine.preemption import PENDING_VALIDATION, TrainingPreempted
    train_cfg = dict(type='IterBasedTrainLoop', max_iters=12, val_interval=6)
    checkpoint = dict(by_epoch=False, interval=checkpoint_interval)
    full = _Validations()
    _toy_runner(tmp_path / 'full', train_cfg, checkpoint, signal_at=0, validations=full).train()
    assert [it for it, _ in full.passes] == [6, 12]

    stopped = _Validations()
    with pytest.raises(TrainingPreempted):
        _toy_runner(tmp_path / 'run', train_cfg, checkpoint, signal_at=6, validations=stopped).train()
    assert stopped.passes == []
    ckpt = torch.load(tmp_path / 'run' / 'iter_6.pth', weights_only=False)
    assert ckpt['meta']['iter'] == 6 and ckpt['meta'][PENDING_VALIDATION] == 6

    resumed = _Validations()
    _toy_runner(tmp_path / 'run', train_cfg, checkpoint, signal_at=0, validations=resumed,
                resume=str(tmp_path / 'run' / 'iter_6.pth')).train()
    assert resumed.passes == full.passes


@pytest.mark.parametrize('by_epoch', [False, True])
def test_iteration_loop_stops_with_a_checkpoint_of_the_finished_iteration(tmp_path, by_epoch):
    # Also with an epoch-counting checkpoint hook: the pre-emption checkpoint is named by iteration.
    import vit_plugin  # noqa: F401
    from vit_plugin.engine.preemption import TrainingPreempted
    previous = signal.getsignal(signal.SIGTERM)
    runner = _toy_runner(tmp_path, dict(type='IterBasedTrainLoop', max_iters=20),
                         dict(by_epoch=by_epoch, interval=100), signal_at=6)
    with pytest.raises(TrainingPreempted) as info:
        runner.train()
    assert info.value.code == EXIT_PREEMPTED and 'SIGTERM' in str(info.value)
    hook = next(h for h in runner.hooks if isinstance(h, AtomicCheckpointHook))
    assert hook.backend_args == dict(backend='vit_plugin_atomic_local')  # files written via atomic_write_bytes
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored
    assert torch.load(tmp_path / 'iter_6.pth', weights_only=False)['meta']['iter'] == 6
    assert find_resumable_checkpoint(str(tmp_path), warn=None) == str(tmp_path / 'iter_6.pth')
    if not by_epoch:
        assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == ['iter_6.pth']
        assert (tmp_path / 'last_checkpoint').read_text() == 'iter_6.pth'
    # (An epoch-counting hook also writes its end-of-run epoch_1.pth in after_train, as mmengine's does.)


def test_epoch_loop_stops_without_a_mid_epoch_checkpoint(tmp_path):
    import vit_plugin  # noqa: F401
    from vit_plugin.engine.preemption import TrainingPreempted
    runner = _toy_runner(tmp_path, dict(by_epoch=True, max_epochs=5), dict(by_epoch=True, interval=1), signal_at=6)
    with pytest.raises(TrainingPreempted):
        runner.train()  # 4 iterations per epoch: stops after iteration 6, in epoch 2
    assert runner.iter == 5  # the loop was left during iteration 6 (counted from 0: 5)
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == ['epoch_1.pth']
