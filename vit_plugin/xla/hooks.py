"""Hooks of the XLA training path, installed by the XLA train loops: deferred logging, recompilation guard."""
import json
import logging
import os.path as osp
import time
from typing import Dict, List, Optional

from mmengine.dist import master_only
from mmengine.hooks import Hook, LoggerHook, RuntimeInfoHook
from mmengine.logging import print_log

from vit_plugin.registry import HOOKS

from . import runtime


def _logger_interval(runner) -> int:
    for hook in runner.hooks:
        if isinstance(hook, LoggerHook):
            return max(1, int(hook.interval))
    return 50  # LoggerHook's default, for runs configured without one


@HOOKS.register_module()
class XLARuntimeInfoHook(RuntimeInfoHook):
    """RuntimeInfoHook that moves logged losses to the host in one batch, when a logger or checkpoint reads them."""

    priority = 'VERY_HIGH'

    def __init__(self):
        self._pending: List[Dict] = []

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        step = dict(outputs or {})
        pop = getattr(runner.optim_wrapper, 'pop_scalars', None)
        if pop is not None:
            step.update(pop())
        self._pending.append(step)
        interval = _logger_interval(runner)
        if (self.every_n_train_iters(runner, interval) or self.every_n_inner_iters(batch_idx, interval)
                or self.end_of_epoch(runner.train_dataloader, batch_idx)
                or self.is_last_train_iter(runner)):
            self.flush(runner)

    def flush(self, runner) -> None:
        """Transfer the pending scalars to the host (one transfer) and record them in order."""
        if not self._pending:
            return
        pending, self._pending = runtime.to_cpu(self._pending), []
        for step in pending:
            for key, value in step.items():
                runner.message_hub.update_scalar(f'train/{key}', value)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        # The message hub is saved after this hook runs (the checkpoint dict holds a reference).
        self.flush(runner)
        checkpoint['message_hub'] = runner.message_hub.state_dict()

    def after_train_epoch(self, runner) -> None:
        self.flush(runner)

    def before_val(self, runner) -> None:
        self.flush(runner)
        super().before_val(runner)


_CAUSE_CUT = ('the step ran as {n} graph executions instead of 1: something inside train_step read '
              'a device value on the host (.item(), .cpu(), .tolist(), float(t), print(t), or Python '
              '`if`/`while` on a tensor). That cuts the graph, and a value that changes every step '
              'then produces a new graph. Keep such values on the device, or read them in a hook '
              'after the step.')
_CAUSE_SHAPE = ('the input shapes changed from {old} to {new} (dynamic shape): use drop_last=True, '
                'fixed image sizes and fixed-size masks so every batch has the same shapes.')
_CAUSE_FALLBACK = ('these ops have no XLA lowering and ran on the host, usually because their output '
                   'shape depends on the data (nonzero, masked_select, boolean-mask indexing, '
                   'unique): {ops}. Use fixed-size alternatives (torch.where, gather with fixed '
                   'counts, multiplying by a mask).')
# The op torch_xla records when .item() / float() / bool() reads a device scalar on the host.
_ITEM_OP = 'aten::_local_scalar_dense'
_CAUSE_UNKNOWN = ('no input-shape change or graph cut was seen; a Python value that changes each step '
                  'may be baked into the graph as a constant (e.g. a shape computed from data).')


@HOOKS.register_module()
class XLARecompileGuardHook(Hook):
    """Count XLA graph compilations; warn, naming the likely cause, when a steady-state step recompiles.

    Writes ``<log_dir>/xla_summary.json`` at the end of training.

    Args:
        warmup_iters (int): Iterations allowed to compile: 3, or ``2 * k + 1`` with gradient
            accumulation over ``k``. Defaults to 3.
        max_warnings (int): Warnings before going quiet (the count goes on). Defaults to 5.
    """

    priority = 'VERY_HIGH'

    def __init__(self, warmup_iters: int = 3, max_warnings: int = 5):
        if warmup_iters < 1:
            raise ValueError(f'XLARecompileGuardHook: warmup_iters must be >= 1, got {warmup_iters}.')
        self.warmup_iters = warmup_iters
        self.max_warnings = max_warnings
        self.warmup_compiles = 0
        self.steady_compiles = 0
        self.recompiled_iters: List[int] = []
        self._seen = 0
        self._warned = 0
        self._counter = None
        self._last = None
        self._shapes = None
        self._fallbacks = set()
        self._last_time = None
        self._steady_seconds = 0.
        self._steady_iters = 0
        self.steady_max_executions = 0

    def _snapshot(self):
        return self._counter.compiles, self._counter.executions

    def before_train(self, runner) -> None:
        self._counter = runtime.CompileCounter()
        self._last = self._snapshot()
        self._fallbacks = set(self._counter.fallback_ops())
        self._start_compile_seconds = self._counter.compile_seconds

    def after_val(self, runner) -> None:
        # Validation compiles its own graphs; start counting afresh for the next training step.
        if self._counter is not None:
            self._last = self._snapshot()
            self._last_time = time.perf_counter()  # the time spent validating is not a step's

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        compiles, executions = self._snapshot()
        new_compiles = compiles - self._last[0]
        new_executions = executions - self._last[1]
        self._last = (compiles, executions)
        shapes = runtime.input_shapes(data_batch)
        old_shapes, self._shapes = self._shapes, shapes
        self._seen += 1
        now, last_time, self._last_time = time.perf_counter(), self._last_time, time.perf_counter()
        if self._seen <= self.warmup_iters:
            self.warmup_compiles += new_compiles
            return
        if last_time is not None:
            self._steady_seconds += now - last_time
            self._steady_iters += 1
        self.steady_max_executions = max(self.steady_max_executions, new_executions)
        if new_compiles == 0:
            return
        self.steady_compiles += new_compiles
        self.recompiled_iters.append(runner.iter + 1)
        if self._warned >= self.max_warnings:
            return
        self._warned += 1
        causes = []
        if old_shapes is not None and shapes != old_shapes:
            causes.append(_CAUSE_SHAPE.format(old=old_shapes, new=shapes))
        if new_executions > 1:
            causes.append(_CAUSE_CUT.format(n=new_executions))
        fallbacks = set(self._counter.fallback_ops())
        new_fallbacks, self._fallbacks = sorted(fallbacks - self._fallbacks), fallbacks
        if _ITEM_OP in new_fallbacks:  # the host read itself, not a missing lowering
            new_fallbacks.remove(_ITEM_OP)
            if new_executions <= 1:
                causes.append(_CAUSE_CUT.format(n='more'))
        if new_fallbacks:
            causes.append(_CAUSE_FALLBACK.format(ops=', '.join(new_fallbacks)))
        if not causes:
            causes.append(_CAUSE_UNKNOWN)
        print_log(
            f'XLA recompilation at iteration {runner.iter + 1} (after {self.warmup_iters} warm-up '
            f'iterations): {new_compiles} new graph(s) compiled. Likely cause: ' + ' Also: '.join(causes)
            + ' Run with PT_XLA_DEBUG_LEVEL=2 to have torch_xla print the Python frame of each '
            'compilation.', logger='current', level=logging.WARNING)

    def summary(self) -> dict:
        """Compile counts and times of this run (seconds; step time measured after warm-up)."""
        step = self._steady_seconds / self._steady_iters if self._steady_iters else None
        compile_seconds = None
        if self._counter is not None:
            compile_seconds = self._counter.compile_seconds - self._start_compile_seconds
        return dict(warmup_iters=self.warmup_iters, warmup_compiles=self.warmup_compiles,
                    steady_compiles=self.steady_compiles, recompiled_iters=self.recompiled_iters,
                    steady_max_executions=self.steady_max_executions,
                    compile_seconds=compile_seconds, steady_iters=self._steady_iters,
                    steady_step_seconds=step)

    def after_train(self, runner) -> None:
        summary = self.summary()
        print_log(f'XLA: {summary["warmup_compiles"]} graph(s) compiled in the first '
                  f'{self.warmup_iters} iteration(s), {summary["steady_compiles"]} afterwards; '
                  f'compile time {summary["compile_seconds"]:.2f} s; steady-state step '
                  f'{_ms(summary["steady_step_seconds"])}.', logger='current')
        self._dump(runner, summary)

    @master_only
    def _dump(self, runner, summary: dict) -> None:
        with open(osp.join(runner.log_dir, 'xla_summary.json'), 'w') as f:
            json.dump(summary, f, indent=1)


def _ms(seconds: Optional[float]) -> str:
    return 'n/a (too few iterations)' if seconds is None else f'{seconds * 1e3:.1f} ms'
