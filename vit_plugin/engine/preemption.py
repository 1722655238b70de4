"""Stop cleanly on SIGTERM / SIGUSR1: finish the iteration, write a checkpoint, exit :data:`EXIT_PREEMPTED`."""
import math
from typing import Optional, Sequence

import torch
from mmengine.dist import all_reduce, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook, Hook
from mmengine.optim import OptimWrapperDict
from mmengine.runner import IterBasedTrainLoop

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.engine.checkpointing import write_last_checkpoint
from vit_plugin.engine.data_identity import use_data_identity_hook
from vit_plugin.registry import HOOKS
from vit_plugin.runtime import (SignalHandlers, WorkerShield, in_main_thread, is_signal_name, signal_name,
                                signal_number)

#: Exit status of a run stopped by a signal after writing its checkpoint (``EX_TEMPFAIL`` of
#: sysexits.h: a temporary failure, the caller is invited to retry, here with ``--resume``).
EXIT_PREEMPTED = 75

#: Key of a checkpoint's ``meta`` naming the iteration whose validation the stop skipped.
PENDING_VALIDATION = 'pending_validation'


class TrainingPreempted(SystemExit):
    """Raised at the end of a run stopped by a signal; exits the interpreter with :data:`EXIT_PREEMPTED`."""

    def __init__(self, message: str):
        super().__init__(EXIT_PREEMPTED)
        self.message = message

    def __str__(self):
        return self.message


def _accumulative_counts(runner) -> int:
    wrapper = getattr(runner, 'optim_wrapper', None)
    wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
    return max([mmengine_compat.accumulative_counts(w) or 1 for w in wrappers if w is not None] or [1])


def _checkpoint_hook_saves_now(hook: CheckpointHook, runner) -> bool:
    """Whether mmengine's CheckpointHook writes a checkpoint after this iteration (its own rule)."""
    if hook.by_epoch:
        return False
    return hook.every_n_train_iters(runner, hook.interval, hook.save_begin) or \
        (hook.save_last and hook.is_last_train_iter(runner))


def _validation_due(loop: IterBasedTrainLoop, runner, iteration: int) -> bool:
    """Whether the iteration-based loop validates after ``iteration`` (its own rule)."""
    return runner.val_loop is not None and iteration >= loop.val_begin and (
        iteration % loop.val_interval == 0 or iteration == loop.max_iters)


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Turn a termination signal into a checkpoint and exit status :data:`EXIT_PREEMPTED`.

    See docs/configs.md#training-and-testing ("Pre-emption-safe runs").

    Args:
        signals (Sequence[str], optional): Names of the signals to handle. Defaults to None: SIGTERM and
            SIGUSR1 (where it exists).
        check_interval (int): Iterations between two agreements of a multi-process run, rounded up to
            whole accumulation cycles. Defaults to 10.
    """
    # After the parameter schedulers (LOW), whose state the checkpoint holds, and before the
    # checkpoint hook (VERY_LOW), which then knows the run is stopping.
    priority = 80

    def __init__(self, signals: Optional[Sequence[str]] = None, check_interval: int = 10):
        if signals is None:
            signals = [name for name in ('SIGTERM', 'SIGUSR1') if is_signal_name(name)]
        unknown = [name for name in signals if not is_signal_name(name)]
        if unknown:
            raise ValueError(f'PreemptionHook(signals=...): {unknown} are not signal names on this system '
                             f'(e.g. SIGTERM, SIGUSR1, SIGUSR2, SIGINT).')
        if not isinstance(check_interval, int) or isinstance(check_interval, bool) or check_interval < 1:
            raise ValueError(f'PreemptionHook: check_interval must be an integer >= 1, got {check_interval!r} '
                             f'(default_hooks.preemption in the config).')
        self.signals = [signal_number(name) for name in signals]
        self.check_interval = check_interval
        # From construction on: an iteration-based loop starts its data-loader workers before before_run.
        self._shield = WorkerShield(self.signals)
        self._handlers = SignalHandlers(self.signals, self._handle)
        self.received: Optional[int] = None
        self.stopped_at: Optional[int] = None
        self._pending_validation: Optional[int] = None
        self._skip_validation_at: Optional[int] = None

    def _handle(self, signum, frame):
        self.received = signum

    def before_run(self, runner) -> None:
        self._shield.hold()  # again for a second run of the same runner
        if not in_main_thread():
            runner.logger.warning('PreemptionHook: not in the main thread, so no signal handlers are installed.')
            return
        self._handlers.install()

    def release(self) -> None:
        """Give the signals back to their previous handlers (``after_run``; :func:`release_signals`)."""
        self._restore()

    def _restore(self) -> None:
        self._handlers.restore()
        self._shield.release()

    def _interval(self, runner) -> int:
        """Iterations between two checks: whole accumulation cycles, >= ``check_interval`` if distributed."""
        cycle = _accumulative_counts(runner)
        if get_world_size() == 1:
            return cycle
        return cycle * math.ceil(self.check_interval / cycle)

    def _any_process_signalled(self) -> bool:
        if get_world_size() == 1:
            return self.received is not None
        flag = torch.tensor([0 if self.received is None else int(self.received)], dtype=torch.int64)
        all_reduce(flag, op='max')  # moves the flag to the backend's device and back
        value = int(flag.item())
        if value and self.received is None:
            self.received = value
        return bool(value)

    # ------------------------------------------------------------------------------------- resume
    def after_load_checkpoint(self, runner, checkpoint) -> None:
        self._pending_validation = (checkpoint.get('meta') or {}).get(PENDING_VALIDATION)

    def before_train_epoch(self, runner) -> None:
        pending, self._pending_validation = self._pending_validation, None
        if pending is None or pending != runner.iter or runner.val_loop is None:
            return  # not a resume of a pre-empted run whose validation was skipped
        runner.logger.info(f'Running the validation of iteration {pending}, which the pre-empted run skipped.')
        runner.val_loop.run()
        runner.model.train()

    # ------------------------------------------------------------------------------------- stopping
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if self.stopped_at is not None or (runner.iter + 1) % self._interval(runner):
            return
        if not self._any_process_signalled():
            return
        name = signal_name(self.received)
        self.stopped_at = runner.iter + 1
        loop = runner.train_loop
        if not isinstance(loop, IterBasedTrainLoop):
            runner.logger.warning(
                f'{name} received: stopping after iteration {self.stopped_at}. {type(loop).__name__} can only '
                f'resume at an epoch boundary, so no checkpoint is written now; --resume restarts epoch '
                f'{runner.epoch + 1} from the last epoch checkpoint.')
            self._finish(runner)  # raises: the epoch loop has no way to stop in the middle of an epoch
        if _validation_due(loop, runner, self.stopped_at):
            self._skip_validation_at = self.stopped_at
            # The loop validates after this hook returns: the pass is left to the resumed run.
            loop.val_begin = math.inf
        runner.logger.warning(f'{name} received: saving the checkpoint of iteration {self.stopped_at} and stopping'
                              + (' (its validation runs on --resume).' if self._skip_validation_at else '.'))
        self._save(runner)
        loop.stop_training = True  # the loop ends after this iteration; after_train/after_run hooks run

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        if self._skip_validation_at is not None and runner.iter + 1 == self._skip_validation_at:
            checkpoint.setdefault('meta', {})[PENDING_VALIDATION] = self._skip_validation_at

    def _save(self, runner) -> None:
        save_iteration_checkpoint(runner)

    def after_run(self, runner) -> None:
        self._restore()
        if self.stopped_at is not None:
            self._finish(runner)

    def _finish(self, runner):
        self._restore()
        name = signal_name(self.received)
        message = (f'Training stopped by {name} after iteration {self.stopped_at}; continue with '
                   f'`tools/train.py CONFIG --work-dir {runner.work_dir} --resume` (exit status {EXIT_PREEMPTED}).')
        runner.logger.warning(message)
        raise TrainingPreempted(message)


def save_iteration_checkpoint(runner) -> Optional[str]:
    """Save iteration ``runner.iter + 1``'s checkpoint as the checkpoint hook would; its path, or None without one."""
    hooks = [h for h in runner.hooks if isinstance(h, CheckpointHook)]
    if not hooks:
        runner.logger.warning('No CheckpointHook in this run: stopping without a checkpoint.')
        return None
    hook, iteration = hooks[0], runner.iter + 1
    out_dir = hook.out_dir or runner.work_dir
    if hook.by_epoch:  # its file names and rotation count epochs; this checkpoint is an iteration's
        filename = f'iter_{iteration}.pth'
        runner.save_checkpoint(out_dir, filename, save_optimizer=hook.save_optimizer,
                               save_param_scheduler=hook.save_param_scheduler, by_epoch=False,
                               backend_args=hook.backend_args)
        path = hook.file_backend.join_path(out_dir, filename)
        if is_main_process():
            write_last_checkpoint(runner.work_dir, path)
        return path
    if not _checkpoint_hook_saves_now(hook, runner):  # else the checkpoint hook saves this very iteration
        mmengine_compat.save_checkpoint_as_configured(hook, runner)  # rotation (max_keep_ckpts), last_checkpoint
    return hook.file_backend.join_path(out_dir, hook.filename_tmpl.format(iteration))


#: Type names that build mmengine's own CheckpointHook (whatever the config's default scope).
_PLAIN_CHECKPOINT_HOOKS = {'CheckpointHook', 'mmengine.CheckpointHook', 'mmpretrain.CheckpointHook',
                           'mmdet.CheckpointHook'}


def use_preemption_safe_hooks(cfg) -> None:
    """Give ``cfg`` atomic checkpoints and the pre-emption and data-identity hooks it lacks (in place)."""
    hooks = cfg.get('default_hooks')
    if hooks is None:
        cfg.default_hooks = hooks = {}
    checkpoint = hooks.get('checkpoint')
    if checkpoint is not None and checkpoint.get('type') in _PLAIN_CHECKPOINT_HOOKS:
        checkpoint['type'] = 'vit_plugin.AtomicCheckpointHook'
    if 'preemption' not in hooks:
        hooks['preemption'] = dict(type='vit_plugin.PreemptionHook')
    use_data_identity_hook(cfg)


def release_signals(runner) -> None:
    """:meth:`PreemptionHook.release` for each of ``runner``'s pre-emption hooks."""
    for hook in runner.hooks:
        if isinstance(hook, PreemptionHook):
            hook.release()
