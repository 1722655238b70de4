"""The timing loop of every benchmark: steps timed in turns, round after round (paired rounds).

A shared machine's speed drifts (other tenants, clock changes), so steps that are compared run back
to back within each round and are compared round by round: the median of per-round ratios cancels
the drift that a ratio of two medians keeps.
"""
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch


class Stopwatch:
    """Wall-clock timing on the host. With ``device='cuda'`` it waits for the GPU before it starts and
    before it stops, so the time covers the queued work of the timed call and nothing earlier."""

    def __init__(self, device: str = 'cpu'):
        self.device = device

    def _sync(self) -> None:
        if self.device == 'cuda':
            torch.cuda.synchronize()

    def start(self) -> None:
        self._sync()
        self._start = time.perf_counter()

    def stop(self) -> float:
        self._sync()
        return time.perf_counter() - self._start


class CudaStopwatch(Stopwatch):
    """CUDA events recorded on the current stream around the timed work; ``stop`` waits for the end
    event, so the time is the GPU's (launch gaps included, earlier queued work excluded)."""

    def __init__(self):
        super().__init__('cuda')

    def start(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3


def paired_rounds(steps: Dict[str, Callable[[], object]], rounds: int, *, warmup: int = 0,
                  stopwatch: Optional[Stopwatch] = None, rotate: bool = False, own_clock: bool = False,
                  before_round: Optional[Callable[[], None]] = None,
                  after_step: Optional[Callable[[str], None]] = None) -> Dict[str, List[float]]:
    """Seconds of each step in each round: every round calls every step once, in turns.

    Args:
        steps (dict): Name -> a call without arguments; dict order is the order within a round.
        rounds (int): Timed rounds (one entry per step and round in the result).
        warmup (int): Untimed rounds first (each step in turn).
        stopwatch (Stopwatch, optional): Defaults to a host :class:`Stopwatch`.
        rotate (bool): Round ``i`` starts with step ``i`` (modulo their number), so that a drift within
            rounds hits every step alike.
        own_clock (bool): The steps return their own seconds (e.g. measured between iterations inside a
            training run); the loop then only orders the calls.
        before_round (callable, optional): Called untimed at the start of every timed round.
        after_step (callable, optional): Called untimed with the step's name after each timed call.

    Returns:
        dict: Name -> seconds per round.
    """
    watch = stopwatch or Stopwatch()
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times = {name: [] for name in names}
    for index in range(rounds):
        if before_round is not None:
            before_round()
        shift = index % len(names) if rotate else 0
        for name in names[shift:] + names[:shift]:
            if own_clock:
                times[name].append(steps[name]())
            else:
                watch.start()
                steps[name]()
                times[name].append(watch.stop())
            if after_step is not None:
                after_step(name)
    return times


def time_calls(step: Callable[[], object], count: int, warmup: int = 0,
               stopwatch: Optional[Stopwatch] = None) -> List[float]:
    """Seconds of each of ``count`` calls of ``step`` after ``warmup`` untimed ones."""
    return paired_rounds({'step': step}, count, warmup=warmup, stopwatch=stopwatch)['step']


def time_median(step: Callable[[], object], repeats: int = 5, warmup: int = 2,
                stopwatch: Optional[Stopwatch] = None) -> float:
    """Median seconds of one call of ``step`` over ``repeats`` calls after ``warmup`` untimed ones."""
    return statistics.median(time_calls(step, repeats, warmup, stopwatch))
