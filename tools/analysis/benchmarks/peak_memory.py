"""The peak-memory probes of the benchmarks: one function per allocator, each around one call.

* :func:`cuda_peak_bytes`: ``torch.cuda.max_memory_allocated`` (the CUDA caching allocator);
* :func:`cpu_peak_bytes`: torch's CPU allocations, from the profiler's memory events;
* :func:`heap_peak_bytes`: Python heap allocations (``tracemalloc``; numpy reports to it);
* :func:`max_rss_mib` and :func:`rss_mib`: the process's peak and current resident set, for work that
  is not torch's alone (a subprocess per variant keeps the peak its own).
"""
import os
import resource
import tracemalloc
from typing import Callable, Tuple

import torch


def cuda_peak_bytes(step: Callable[[], object]) -> int:
    """``torch.cuda.max_memory_allocated`` over one call of ``step``: everything the process holds on the
    GPU at that moment (weights, optimizer state) plus what the call allocates."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def cpu_peak_bytes(step: Callable[[], object]) -> int:
    """Peak bytes allocated by torch on the CPU during one call of ``step`` (profiler allocator events),
    counted from the level at the call's start."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start)
    level = peak = 0
    for event in events:
        level += event.cpu_memory_usage
        peak = max(peak, level)
    return peak


def heap_peak_bytes(step: Callable[[], object]) -> Tuple[object, int]:
    """(``step()``'s result, the ``tracemalloc`` peak of the Python heap during the call)."""
    tracemalloc.start()
    try:
        result = step()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def max_rss_mib() -> float:
    """The process's peak resident set size so far (``ru_maxrss``, KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """The process's resident set size now (``/proc/self/statm``), in MiB.

    The kernel counts resident pages per CPU, so this and :func:`max_rss_mib` may disagree by a few
    hundred KiB when read at different moments.
    """
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20
