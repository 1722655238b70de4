"""Pre-emption-safe training: SIGTERM / SIGUSR1 stop a run with a checkpoint, and ``--resume`` finds the
newest intact checkpoint of the work dir it is given.

The end-to-end tests train a 2-block ViT on 192 digits with an iteration-based loop (as the paper's
configs use) and compare losses with an uninterrupted run of the same config. The runs that get a signal
are ``tools/train.py`` / ``tools/dist_train.sh`` subprocesses; the uninterrupted runs and the resumes to
the end start from imports already made (helpers/warm_runs.py: in the test process, or ranks forked
from a server process). The in-process tests run a real mmengine Runner on a linear model."""
import gc
import os
import os.path as osp
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

from helpers.common import REPO, free_port, read_losses, run_env
from helpers.training_runs import (INTERVAL, MAX_ITERS, dist_cmd, iter_config, losses_list, progress, signal_when,
                                    train_cmd)
from helpers.warm_runs import train_here, train_ranks, warm_config
from vit_plugin.engine.checkpointing import AtomicCheckpointHook, checkpoint_problem, find_resumable_checkpoint
from vit_plugin.engine.preemption import EXIT_PREEMPTED


@pytest.fixture(scope='module')
def reference(tmp_path_factory, digits_root):
    """An uninterrupted single-process run: its config, work dir and per-iteration losses."""
    root = tmp_path_factory.mktemp('preemption')
    cfg = iter_config(root / 'cfg.py', digits_root)
    work = root / 'full'
    outcome = train_here(warm_config(cfg, 'full'), work)
    assert outcome.code == 0, outcome.output[-4000:]
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


# What SLURM does on pre-emption or scancel (SIGTERM; `scancel --signal=USR1`, `--signal=USR1@120`): the
# signal reaches every process of the job, the training process and its two data-loader workers. The
# workers must keep serving batches until the run has saved and stopped, and then end cleanly. The run
# is paced (0.3 s per iteration) so that each signal lands between two checkpoints: SIGTERM stops the
# first run, SIGUSR1 the run resumed from its checkpoint, and a third run finishes. Together they must
# give the uninterrupted run's losses. The three runs are fixtures, each run once; each test checks one
# claim.
@pytest.fixture(scope='module')
def sigterm_stop(tmp_path_factory, digits_root):
    """The first paced run, stopped by SIGTERM to the whole job: its config, work dir, losses and the
    first iteration it did not run."""
    root = tmp_path_factory.mktemp('whole_job')
    cfg = iter_config(root / 'paced.py', digits_root, delay=0.3, num_workers=2)
    work = root / 'run'
    losses, stopped, _ = stop_the_whole_job(cfg, work, INTERVAL + 2, signal.SIGTERM)
    return dict(cfg=cfg, work=work, losses=losses, stopped=stopped)


@pytest.fixture(scope='module')
def sigusr1_stop(sigterm_stop):
    """The run resumed from the first stop, stopped by SIGUSR1 to the whole job."""
    losses, stopped, output = stop_the_whole_job(sigterm_stop['cfg'], sigterm_stop['work'], 2 * INTERVAL + 2,
                                                 signal.SIGUSR1, '--resume')
    return dict(losses=losses, stopped=stopped, output=output)


@pytest.fixture(scope='module')
def last_resume(sigterm_stop, sigusr1_stop):
    """The third run, resumed from the second stop, to the end."""
    resumed = train_here(warm_config(sigterm_stop['cfg'], 'last'), sigterm_stop['work'], '--resume')
    assert resumed.code == 0, resumed.output[-4000:]
    return dict(losses=read_losses(sigterm_stop['work']), output=resumed.output)


@pytest.mark.slow
def test_sigterm_to_the_whole_job_saves_and_stops_between_two_checkpoints(sigterm_stop):
    first, stopped = sigterm_stop['losses'], sigterm_stop['stopped']
    assert sorted(first) == list(range(stopped)) and INTERVAL + 2 <= stopped < 2 * INTERVAL


@pytest.mark.slow
def test_sigusr1_to_the_whole_job_stops_the_resumed_run(sigterm_stop, sigusr1_stop):
    stopped, stopped_again = sigterm_stop['stopped'], sigusr1_stop['stopped']
    assert f'iter_{stopped}.pth' in sigusr1_stop['output']
    assert sorted(sigusr1_stop['losses']) == list(range(stopped, stopped_again)) and 2 * INTERVAL + 2 <= stopped_again


@pytest.mark.slow
def test_resume_after_the_second_stop_finishes_the_run(sigusr1_stop, last_resume):
    stopped_again = sigusr1_stop['stopped']
    assert f'iter_{stopped_again}.pth' in last_resume['output']
    assert sorted(last_resume['losses']) == list(range(stopped_again, MAX_ITERS))


@pytest.mark.slow
def test_stopped_and_resumed_runs_repeat_the_uninterrupted_losses(reference, sigterm_stop, sigusr1_stop,
                                                                   last_resume):
    for losses in (sigterm_stop['losses'], sigusr1_stop['losses'], last_resume['losses']):
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

    resumed = train_here(warm_config(reference['cfg'], 'copy'), copy, '--resume')
    output = resumed.output
    assert resumed.code == 0, output[-4000:]
    assert f'skips checkpoint {newest}: it is truncated' in output
    assert f'Load checkpoint from {copy / f"iter_{2 * INTERVAL}.pth"}' in output
    after = read_losses(copy)
    assert sorted(after) == list(range(2 * INTERVAL, MAX_ITERS))
    np.testing.assert_allclose(losses_list(after, sorted(after)),
                               losses_list(reference['losses'], sorted(after)), rtol=0, atol=1e-6)
    assert (copy / 'last_checkpoint').read_text() == f'iter_{MAX_ITERS}.pth'
    assert checkpoint_problem(str(newest)) is None  # rewritten whole by the resumed run


# 2 Gloo processes through tools/dist_train.sh (the uninterrupted run and the resume: forked ranks);
# SIGUSR1 reaches only rank 1 (as a scheduler that signals one task would). Both ranks must stop after
# the same iteration, rank 0 must write that iteration's checkpoint, and --resume must repeat every
# rank's losses of the uninterrupted run. The three runs are fixtures, each run once; each test checks
# one claim.
@pytest.fixture(scope='module')
def ddp_reference(tmp_path_factory, digits_root):
    """The uninterrupted 2-process run: its config and each rank's losses."""
    root = tmp_path_factory.mktemp('ddp_preemption')
    full = root / 'full'
    cfg = iter_config(root / 'cfg.py', digits_root, batch_size=16)
    outcome = train_ranks(warm_config(cfg, 'full'), full)
    assert outcome.code == 0, outcome.output[-4000:]
    return dict(root=root, cfg=cfg, losses=[read_losses(full, rank) for rank in (0, 1)])


@pytest.fixture(scope='module')
def ddp_stop(ddp_reference, digits_root):
    """The paced 2-process run, SIGUSR1 to rank 1: work dir, exit status, output, each rank's losses and
    the first iteration it did not run."""
    root = ddp_reference['root']
    paced = iter_config(root / 'paced.py', digits_root, batch_size=16, delay=0.3)
    work = root / 'run'
    proc = subprocess.Popen(dist_cmd(paced, work), env=dict(run_env(), PORT=str(free_port())), cwd=REPO,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status, output = signal_when(proc, work, after_iters=INTERVAL + 2, target='worker', signum=signal.SIGUSR1,
                                 rank=1)
    interrupted = [read_losses(work, rank) for rank in (0, 1)]
    return dict(work=work, status=status, output=output, losses=interrupted, stopped=max(interrupted[0]) + 1)


@pytest.fixture(scope='module')
def ddp_resumed(ddp_reference, ddp_stop):
    """``--resume`` of the stopped 2-process run, in its work dir."""
    outcome = train_ranks(warm_config(ddp_reference['cfg'], 'resume'), ddp_stop['work'], '--resume')
    assert outcome.code == 0, outcome.output[-4000:]
    return ddp_stop['work']


@pytest.mark.slow
def test_ddp_signal_to_one_process_stops_the_job_as_preempted(ddp_stop):
    status, output = ddp_stop['status'], ddp_stop['output']
    assert status != 0 and f'exitcode  : {EXIT_PREEMPTED}' in output, output[-4000:]  # torchrun's report


@pytest.mark.slow
def test_ddp_signal_to_one_process_stops_all_at_the_same_iteration(ddp_stop):
    interrupted, stopped, work = ddp_stop['losses'], ddp_stop['stopped'], ddp_stop['work']
    assert sorted(interrupted[0]) == sorted(interrupted[1]) == list(range(stopped))
    # The processes agree every 10 iterations (PreemptionHook's check_interval), so both stop at the
    # first multiple of 10 at or after rank 1 received the signal (after it finished iteration 10).
    assert stopped % 10 == 0 and INTERVAL + 2 <= stopped <= INTERVAL + 2 + 10, stopped
    assert (work / 'last_checkpoint').read_text() == f'iter_{stopped}.pth'


@pytest.mark.slow
def test_ddp_resume_repeats_every_ranks_losses(ddp_reference, ddp_stop, ddp_resumed):
    for rank in (0, 1):
        after = read_losses(ddp_resumed, rank)
        assert sorted(after) == list(range(ddp_stop['stopped'], MAX_ITERS))
        np.testing.assert_allclose(losses_list(after, sorted(after)),
                                   losses_list(ddp_reference['losses'][rank], sorted(after)), rtol=0, atol=1e-6)


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


def _toy_runner(work_dir, train_cfg, checkpoint, signal_at, validations=None, resume=None, runner_class=None,
                extra_hooks=()):
    """A real mmengine Runner (or ``runner_class``) on a linear model, in this process (no subprocess
    start-up)."""
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    Runner = runner_class or Runner

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
        custom_hooks=[_SignalAt(signal_at).hook, *extra_hooks] + ([validations.hook] if validations else []),
        default_scope='mmengine', resume=resume is not None, load_from=resume,
        experiment_name=f'preemption_{osp.basename(str(work_dir))}_{signal_at}_{resume is not None}', **val)


def test_the_worker_shield_holds_from_the_hooks_construction_to_its_release():
    """Data-loader workers are forked before ``before_run`` (iteration loops): the shield and its at-fork
    hook come with the hook's construction, and go when the run gives the signals back. Counted against
    what runners of other tests in this process may still hold (SIGUSR2 is in no default)."""
    from vit_plugin import runtime
    from vit_plugin.engine.preemption import PreemptionHook
    gc.collect()  # runners other tests dropped give their shields back
    baseline = runtime.shielded_signals()
    assert signal.SIGUSR2 not in baseline
    hook = PreemptionHook(signals=['SIGUSR2'])
    assert runtime.shielded_signals() == sorted(baseline + [signal.SIGUSR2])
    assert 'vit_plugin.runtime.process:shield_forked_workers' in runtime.fork_hooks()
    hook.release()
    assert runtime.shielded_signals() == baseline
    assert ('vit_plugin.runtime.process:shield_forked_workers' in runtime.fork_hooks()) == bool(baseline)


def test_a_run_that_fails_gives_the_signals_back(tmp_path):
    # A run that ends in an exception has no after_run; vit_plugin's runner restores the handlers itself,
    # so the process (a notebook, a test worker) keeps its own SIGTERM: a forked pool can still end.
    from mmengine.hooks import Hook

    from vit_plugin.engine.runner import Runner

    class FailAt3(Hook):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            if runner.iter + 1 == 3:
                raise RuntimeError('data error in iteration 3')

    previous = signal.getsignal(signal.SIGTERM)
    runner = _toy_runner(tmp_path, dict(type='IterBasedTrainLoop', max_iters=20), dict(by_epoch=False, interval=100),
                         signal_at=0, runner_class=Runner, extra_hooks=[FailAt3()])
    with pytest.raises(RuntimeError, match='iteration 3'):
        runner.train()
    assert signal.getsignal(signal.SIGTERM) is previous


VALIDATED_TRAIN_CFG = dict(type='IterBasedTrainLoop', max_iters=12, val_interval=6)


@pytest.fixture(scope='module')
def uninterrupted_validations(tmp_path_factory):
    """(iteration, metric) of every validation pass of an uninterrupted toy run, validating every 6
    iterations (checkpoints do not change what it trains)."""
    import vit_plugin  # noqa: F401
    full = _Validations()
    _toy_runner(tmp_path_factory.mktemp('validations'), VALIDATED_TRAIN_CFG, dict(by_epoch=False, interval=100),
                signal_at=0, validations=full).train()
    return full.passes


@pytest.mark.parametrize('checkpoint_interval', [6, 100], ids=['checkpoint-hook-saves', 'preemption-hook-saves'])
def test_validation_due_at_the_stop_is_skipped_and_resume_runs_it(tmp_path, uninterrupted_validations,
                                                                 checkpoint_interval):
    # Validation every 6 iterations; the signal arrives in iteration 6. The stopping run must not
    # validate (the scheduler's grace period is for the checkpoint); the resumed run validates the
    # iteration-6 weights first, then trains on. Both must see what an uninterrupted run sees.
    from vit_plugin.engine.preemption import PENDING_VALIDATION, TrainingPreempted
    train_cfg = VALIDATED_TRAIN_CFG
    checkpoint = dict(by_epoch=False, interval=checkpoint_interval)
    assert [it for it, _ in uninterrupted_validations] == [6, 12]

    stopped = _Validations()
    with pytest.raises(TrainingPreempted):
        _toy_runner(tmp_path / 'run', train_cfg, checkpoint, signal_at=6, validations=stopped).train()
    assert stopped.passes == []
    ckpt = torch.load(tmp_path / 'run' / 'iter_6.pth', weights_only=False)
    assert ckpt['meta']['iter'] == 6 and ckpt['meta'][PENDING_VALIDATION] == 6

    resumed = _Validations()
    _toy_runner(tmp_path / 'run', train_cfg, checkpoint, signal_at=0, validations=resumed,
                resume=str(tmp_path / 'run' / 'iter_6.pth')).train()
    assert resumed.passes == uninterrupted_validations


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
