"""``vit_plugin.NonFiniteGuardHook``: skip optimizer steps whose loss or gradients are not finite.

Without it, one NaN/inf loss (a bad batch, a learning-rate spike, an fp16 overflow) reaches
``optimizer.step``: AdamW's moments become NaN and every later step and checkpoint is ruined, while
the log keeps printing. The hook puts a check between the backward pass and the optimizer step of
the run's optimizer wrapper(s):

* every backward pass records whether its loss is finite; before the update, the global gradient
  norm (all parameters, after the DDP all-reduce) is checked as well;
* a non-finite step is dropped *before* the optimizer sees it: parameters, optimizer state (AdamW
  moments and step count) and loss scaler are left exactly as they were, and the gradients are
  zeroed as after any update; the warning names the iteration and the non-finite loss terms;
* under DDP/FSDP the verdict is all-reduced (one scalar per update), so all ranks skip the same
  step and stay in lock-step;
* with gradient accumulation the check covers all micro-batches of the update;
* after ``max_consecutive`` skipped updates in a row the run stops with
  :class:`NonFiniteTrainingError` before the checkpoint hook of that iteration runs; every
  checkpoint on disk holds finite weights (a checkpoint written during the streak holds the last
  good weights unchanged), so ``--resume`` continues from it.

Cost: one norm over the gradients (a read of every gradient, much cheaper than the optimizer's own
update) and one device-to-host read of a scalar per update; on GPUs mmengine already reads every
loss on the host each iteration, so no new synchronisation point is added in practice. On XLA
devices, where a host read splits the step's graph, the hook switches on
:class:`vit_plugin.XLAOptimWrapper`'s on-device guard instead and reads its counters when the
logged losses reach the host (once per logging interval).

With fp16 loss scaling (``AmpOptimWrapper`` with a ``GradScaler``), overflowing *gradients* are
normal and handled by the scaler (it skips the step and lowers the scale); the guard then checks
the loss only.
"""
import logging
import math
from typing import Iterable, List, Optional

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper, OptimWrapperDict

from vit_plugin.engine.optimizers.grad_norm import global_grad_norm
from vit_plugin.registry import HOOKS


class NonFiniteTrainingError(RuntimeError):
    """Raised when too many consecutive optimizer steps had a non-finite loss or gradient."""


def _grads(wrapper: OptimWrapper) -> List[torch.Tensor]:
    return [p.grad for group in wrapper.optimizer.param_groups for p in group['params']
            if p.grad is not None]


class NonFiniteGuard:
    """The per-step check installed on one optimizer wrapper (see the module docstring).

    It wraps the wrapper's ``backward`` (to see each loss) and ``step`` (to veto the update) on the
    instance, so it works with every mmengine wrapper (``OptimWrapper``, ``AmpOptimWrapper``,
    vit_plugin's bf16 wrapper) without a subclass per wrapper type.

    Args:
        wrapper (OptimWrapper): The wrapper to guard.
        check_grad_norm (bool): Also check the global gradient norm. Defaults to True.
    """

    def __init__(self, wrapper: OptimWrapper, check_grad_norm: bool = True):
        self.wrapper = wrapper
        self.check_grad_norm = check_grad_norm
        self._loss_bad: Optional[torch.Tensor] = None
        # Result of the last update decision: None (no update this iteration), True or False.
        self.last_skipped: Optional[bool] = None
        self.last_grad_norm: Optional[float] = None
        self._backward, self._step = wrapper.backward, wrapper.step

        def guarded_step(**kwargs):
            return self.step(**kwargs)

        # mmengine's parameter schedulers wrap ``wrapper.step`` in a call counter when they are built
        # (before this hook runs) and warn if the method they find later lacks the mark; the counter
        # still runs inside ``self._step``, so carry the mark over.
        if hasattr(self._step, '_with_counter'):
            guarded_step._with_counter = self._step._with_counter
        wrapper.backward, wrapper.step = self.backward, guarded_step
        wrapper._nonfinite_guard = self

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad
        self._backward(loss, **kwargs)

    def _uses_loss_scaler(self) -> bool:
        return getattr(self.wrapper, 'loss_scaler', None) is not None

    def should_skip(self) -> bool:
        """Decide (the same on every rank) whether the pending update is non-finite."""
        flags = []
        if self._loss_bad is not None:
            flags.append(self._loss_bad.float())
        self._loss_bad = None
        norm = None
        if self.check_grad_norm and not self._uses_loss_scaler():
            norm = global_grad_norm(_grads(self.wrapper))
            if norm is not None:
                flags.append((~torch.isfinite(norm)).float())
        if not flags:
            return False
        flag = torch.stack([f.reshape(()) for f in flags]).max().reshape(1)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Gradients are already averaged across ranks, but a loss can be inf on one rank only
            # (a term without gradient): the verdict must be common or the ranks would diverge.
            device = torch.device('cuda', torch.cuda.current_device()) \
                if dist.get_backend() == 'nccl' else torch.device('cpu')
            flag = flag.to(device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.last_grad_norm = None if norm is None else float(norm)
        return bool(flag.item())

    def step(self, **kwargs) -> None:
        self.last_skipped = self.should_skip()
        if self.last_skipped:
            return  # update_params zeroes the gradients next, as after a real step
        self._step(**kwargs)

    def pop(self) -> Optional[bool]:
        """Whether the update of the last iteration was skipped (None: no update happened)."""
        skipped, self.last_skipped = self.last_skipped, None
        return skipped


def _wrappers(optim_wrapper) -> Iterable[OptimWrapper]:
    if isinstance(optim_wrapper, OptimWrapperDict):
        return list(optim_wrapper.values())
    return [optim_wrapper]


def _nonfinite_terms(outputs) -> List[str]:
    terms = []
    for key, value in (outputs or {}).items():
        value = value.detach().float() if isinstance(value, torch.Tensor) else value
        try:
            finite = bool(torch.isfinite(torch.as_tensor(value)).all())
        except (TypeError, ValueError, RuntimeError):
            continue
        if not finite:
            terms.append(f'{key}={float(torch.as_tensor(value).float().mean()):g}')
    return terms


@HOOKS.register_module()
class NonFiniteGuardHook(Hook):
    """Skip non-finite optimizer steps; stop the run after too many in a row.

    See :mod:`vit_plugin.engine.hooks.nonfinite_guard` for what is checked and what it costs.

    Args:
        max_consecutive (int): Consecutive skipped updates after which training stops with
            :class:`NonFiniteTrainingError`. A learning rate that diverges produces a streak; one
            bad batch produces one. Defaults to 10.
        check_grad_norm (bool): Check the global gradient norm as well as the loss.
            Defaults to True.
        enabled (bool): False switches the guard off (mmengine does not let configs drop a
            default hook by setting it to None): ``--cfg-options
            default_hooks.nonfinite_guard.enabled=False``. Defaults to True.
    """

    # Before the checkpoint hook (VERY_LOW): a run that stops saves nothing at that iteration.
    priority = 'ABOVE_NORMAL'

    def __init__(self, max_consecutive: int = 10, check_grad_norm: bool = True, enabled: bool = True):
        if not isinstance(max_consecutive, int) or max_consecutive < 1:
            raise ValueError(f'NonFiniteGuardHook: max_consecutive must be an integer >= 1, got '
                             f'{max_consecutive!r} (default_hooks.nonfinite_guard in the config).')
        self.max_consecutive = max_consecutive
        self.check_grad_norm = check_grad_norm
        self.enabled = enabled
        self.consecutive = 0
        self.skipped_total = 0
        self._guards: List[NonFiniteGuard] = []
        self._lazy = False

    def before_train(self, runner) -> None:
        self._guards = []
        if not self.enabled:
            return
        for wrapper in _wrappers(runner.optim_wrapper):
            guard = getattr(wrapper, '_nonfinite_guard', None)
            if guard is None and hasattr(wrapper, 'install_nonfinite_guard'):
                # XLA: the wrapper checks on the device and reports lazily (no host read per step).
                wrapper.install_nonfinite_guard()
                self._lazy = True
                continue
            self._guards.append(guard or NonFiniteGuard(wrapper, self.check_grad_norm))

    def _check_lazy(self, runner) -> None:
        """XLA: read the device counters that arrived with the logged losses (if any)."""
        scalars = runner.message_hub.log_scalars
        if 'train/nonfinite_max_streak' not in scalars:
            return
        skipped = int(scalars['train/nonfinite_skipped'].current())
        worst = int(scalars['train/nonfinite_max_streak'].current())
        if skipped > self.skipped_total:
            print_log(f'NonFiniteGuardHook: {skipped - self.skipped_total} update(s) with a '
                      f'non-finite loss or gradient were skipped on the device before iteration '
                      f'{runner.iter + 1} ({skipped} in this run; longest streak {worst}).',
                      logger='current', level=logging.WARNING)
            self.skipped_total = skipped
        if worst >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f'Training stopped at iteration {runner.iter + 1}: {worst} consecutive updates had a '
                f'non-finite loss or gradient (checked on the device, read at the logging '
                f'interval). None of them changed the weights; every checkpoint in '
                f'{runner.work_dir} holds finite weights. Lower the learning rate or check the '
                f'data, then continue with `--resume`.')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._lazy:
            self._check_lazy(runner)
        results = [guard.pop() for guard in self._guards]
        results = [r for r in results if r is not None]
        if not results:
            return  # no update this iteration (gradient accumulation)
        if not any(results):
            self.consecutive = 0
            return
        self.consecutive += 1
        self.skipped_total += 1
        iteration = runner.iter + 1
        terms = _nonfinite_terms(outputs)
        norms = [g.last_grad_norm for g in self._guards if g.last_grad_norm is not None]
        cause = (f'non-finite loss terms on this rank: {", ".join(terms)}' if terms else
                 'the loss is finite on this rank: the gradient norm or another rank\'s loss is not')
        norm = f'; gradient norm {norms[0]:g}' if norms and not math.isfinite(norms[0]) else ''
        print_log(f'NonFiniteGuardHook: skipped the update of iteration {iteration} ({cause}{norm}); '
                  f'parameters and optimizer state are unchanged. {self.consecutive} in a row, '
                  f'{self.skipped_total} in this run; the run stops at {self.max_consecutive} in a '
                  f'row.', logger='current', level=logging.WARNING)
        runner.message_hub.update_scalar('train/skipped_steps', self.skipped_total)
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f'Training stopped at iteration {iteration}: {self.consecutive} consecutive updates '
                f'had a non-finite loss or gradient ({cause}). No update was applied and no '
                f'checkpoint was written at this iteration; every checkpoint in {runner.work_dir} '
                f'holds finite weights. Lower the learning rate or check the data of these '
                f'iterations, then continue with `tools/train.py CONFIG --resume` (or raise '
                f'default_hooks.nonfinite_guard.max_consecutive).')
