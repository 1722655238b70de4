"""Stop cleanly on SIGTERM / SIGUSR1 (spot VMs, SLURM pre-emption): finish the current iteration,
write a checkpoint and exit with :data:`EXIT_PREEMPTED`."""
import os
import signal
import threading
from typing import Optional, Sequence

import torch
from mmengine.dist import all_reduce, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook, Hook
from mmengine.runner import IterBasedTrainLoop

from vit_plugin.engine.checkpointing import write_last_checkpoint
from vit_plugin.registry import HOOKS

#: Exit status of a run stopped by a signal after writing its checkpoint (``EX_TEMPFAIL`` of
#: sysexits.h: a temporary failure, the caller is invited to retry, here with ``--resume``).
EXIT_PREEMPTED = 75

#: Signals that processes forked from this one (data-loader workers) ignore.
_IGNORED_IN_CHILDREN: set = set()


def _ignore_in_child():
    for signum in _IGNORED_IN_CHILDREN:
        signal.signal(signum, signal.SIG_IGN)


# A scheduler may signal every process of the job (e.g. `scancel --signal=USR1`), data-loader workers
# included, and SIGUSR1 ends a process that has no handler for it: the parent would then fail on its
# next batch before it could checkpoint. Workers forked while a PreemptionHook is active ignore the
# signals it handles. SIGTERM is left alone: torch's workers install their own handler for it (they
# exit when their parent terminates them, and die when anyone else sends it).
if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_ignore_in_child)


class TrainingPreempted(SystemExit):
    """Raised at the end of a run stopped by a signal; exits the interpreter with :data:`EXIT_PREEMPTED`."""

    def __init__(self, message: str):
        super().__init__(EXIT_PREEMPTED)
        self.message = message

    def __str__(self):
        return self.message


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Turn a termination signal into a checkpoint and a clean exit.

    The signal handler only records the signal; the training step in progress finishes. After it,
    every process learns whether any process was signalled (one all-reduce of a flag per iteration
    in distributed runs, so that all stop after the same iteration even when the signal reaches them
    at different times), the checkpoint of that iteration is written through the run's checkpoint
    hook (atomically with :class:`~vit_plugin.engine.checkpointing.AtomicCheckpointHook`), the loop
    stops, the remaining ``after_train`` / ``after_run`` hooks run, and :class:`TrainingPreempted`
    ends the process with status :data:`EXIT_PREEMPTED` (75). ``tools/train.py --resume`` continues
    from that checkpoint, with the losses of the uninterrupted run (see ``vit_plugin.RNGReseedHook``).

    Epoch-based loops (mmengine's ``EpochBasedTrainLoop``) can only resume at an epoch boundary: there
    the hook stops after the current iteration without a new checkpoint, and ``--resume`` restarts the
    interrupted epoch from the last epoch checkpoint.

    Args:
        signals (Sequence[str], optional): Names of the signals to handle. Defaults to None: SIGTERM and
            SIGUSR1 (SIGTERM alone where SIGUSR1 does not exist, e.g. on Windows).
    """
    priority = 'LOWEST'  # after the checkpoint hook (VERY_LOW): it may already have saved this iteration

    def __init__(self, signals: Optional[Sequence[str]] = None):
        if signals is None:
            signals = [name for name in ('SIGTERM', 'SIGUSR1') if hasattr(signal, name)]
        unknown = [name for name in signals if not hasattr(signal, name)]
        if unknown:
            raise ValueError(f'PreemptionHook(signals=...): {unknown} are not signal names on this system '
                             f'(e.g. SIGTERM, SIGUSR1, SIGUSR2, SIGINT).')
        self.signals = [getattr(signal, name) for name in signals]
        # From construction on: an iteration-based loop starts its data-loader workers before before_run.
        _IGNORED_IN_CHILDREN.update(s for s in self.signals if s != signal.SIGTERM)
        self.received: Optional[int] = None
        self.stopped_at: Optional[int] = None
        self._previous = {}

    def _handle(self, signum, frame):
        self.received = signum

    def before_run(self, runner) -> None:
        if threading.current_thread() is not threading.main_thread():
            runner.logger.warning('PreemptionHook: not in the main thread, so no signal handlers are installed.')
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        _IGNORED_IN_CHILDREN.difference_update(self.signals)

    def _any_process_signalled(self) -> bool:
        flag = torch.tensor([0 if self.received is None else int(self.received)], dtype=torch.int64)
        if get_world_size() > 1:
            all_reduce(flag, op='max')  # moves the flag to the backend's device and back
        if flag.item() and self.received is None:
            self.received = int(flag.item())
        return bool(flag.item())

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if self.stopped_at is not None or not self._any_process_signalled():
            return
        name = signal.Signals(self.received).name
        self.stopped_at = runner.iter + 1
        loop = runner.train_loop
        if not isinstance(loop, IterBasedTrainLoop):
            runner.logger.warning(
                f'{name} received: stopping after iteration {self.stopped_at}. {type(loop).__name__} can only '
                f'resume at an epoch boundary, so no checkpoint is written now; --resume restarts epoch '
                f'{runner.epoch + 1} from the last epoch checkpoint.')
            self._finish(runner)  # raises: the epoch loop has no way to stop in the middle of an epoch
        runner.logger.warning(f'{name} received: saving the checkpoint of iteration {self.stopped_at} and stopping.')
        self._save(runner)
        loop.stop_training = True  # the loop ends after this iteration; after_train/after_run hooks run

    def _save(self, runner) -> None:
        hooks = [h for h in runner.hooks if isinstance(h, CheckpointHook)]
        if not hooks:
            runner.logger.warning('No CheckpointHook in this run: stopping without a checkpoint.')
            return
        hook = hooks[0]
        if hook.by_epoch:  # its file names and rotation count epochs; this checkpoint is an iteration's
            filename = f'iter_{self.stopped_at}.pth'
            runner.save_checkpoint(hook.out_dir, filename, save_optimizer=hook.save_optimizer,
                                   save_param_scheduler=hook.save_param_scheduler, by_epoch=False,
                                   backend_args=hook.backend_args)
            if is_main_process():
                write_last_checkpoint(runner.work_dir, hook.file_backend.join_path(hook.out_dir, filename))
            return
        expected = hook.file_backend.join_path(hook.out_dir, hook.filename_tmpl.format(self.stopped_at))
        if getattr(hook, 'last_ckpt', None) == expected:
            return  # the checkpoint hook saved this very iteration already
        hook._save_checkpoint(runner)  # rotation (max_keep_ckpts) and last_checkpoint as usual

    def after_run(self, runner) -> None:
        self._restore()
        if self.stopped_at is not None:
            self._finish(runner)

    def _finish(self, runner):
        self._restore()
        name = signal.Signals(self.received).name
        message = (f'Training stopped by {name} after iteration {self.stopped_at}; continue with '
                   f'`tools/train.py CONFIG --work-dir {runner.work_dir} --resume` (exit status {EXIT_PREEMPTED}).')
        runner.logger.warning(message)
        raise TrainingPreempted(message)


#: Type names that build mmengine's own CheckpointHook (whatever the config's default scope).
_PLAIN_CHECKPOINT_HOOKS = {'CheckpointHook', 'mmengine.CheckpointHook', 'mmpretrain.CheckpointHook',
                           'mmdet.CheckpointHook'}


def use_preemption_safe_hooks(cfg) -> None:
    """Give a run atomic checkpoints and signal handling, whatever runtime its config inherits.

    A config whose ``default_hooks.checkpoint`` is mmengine's plain ``CheckpointHook`` (e.g. one based on
    mmdet's or mmpretrain's default runtime) gets ``vit_plugin.AtomicCheckpointHook`` with the same
    arguments, and a ``default_hooks.preemption`` entry (``vit_plugin.PreemptionHook``) is added
    unless the config has one; ``default_hooks.preemption=None`` switches the handling off.
    """
    hooks = cfg.get('default_hooks')
    if hooks is None:
        cfg.default_hooks = hooks = {}
    checkpoint = hooks.get('checkpoint')
    if checkpoint is not None and checkpoint.get('type') in _PLAIN_CHECKPOINT_HOOKS:
        checkpoint['type'] = 'vit_plugin.AtomicCheckpointHook'
    if 'preemption' not in hooks:
        hooks['preemption'] = dict(type='vit_plugin.PreemptionHook')
