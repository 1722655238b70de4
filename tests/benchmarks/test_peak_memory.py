"""The benchmarks' peak-memory probes on the CPU."""
import mmap

import numpy as np
import torch

from benchmarks import peak_memory


def test_cpu_peak_counts_torch_allocations_of_the_call():
    def step():
        a = torch.empty(2**20, dtype=torch.uint8)  # 1 MiB
        b = torch.empty(2**21, dtype=torch.uint8)  # 2 MiB while a is alive
        del a, b

    assert 3 * 2**20 <= peak_memory.cpu_peak_bytes(step) < 4 * 2**20


def test_heap_peak_returns_the_result_and_sees_numpy():
    result, peak = peak_memory.heap_peak_bytes(lambda: int(np.ones(2**20, dtype=np.uint8).sum()))
    assert result == 2**20 and peak >= 2**20


# Linux keeps its resident-set counters per CPU and folds them in batches, so two readings taken at
# different moments may disagree by a few hundred KiB; 16 MiB is far above that and far below the block.
COUNTER_SLACK_MIB = 16
BLOCK_MIB = 256


def test_resident_set_readings_follow_a_touched_block():
    # A mapping of its own, not malloc: in a long-lived worker malloc may hand back free heap pages that
    # are still resident, and freeing may keep them; a fresh mapping is faulted in page by page when
    # written and leaves the resident set when closed.
    region = mmap.mmap(-1, BLOCK_MIB * 2**20)
    before = peak_memory.rss_mib()
    pages = np.frombuffer(region, dtype=np.uint8)
    pages.fill(1)  # every page written
    during = peak_memory.rss_mib()
    assert during - before >= BLOCK_MIB - COUNTER_SLACK_MIB
    assert peak_memory.max_rss_mib() >= during - COUNTER_SLACK_MIB
    del pages
    region.close()
    assert peak_memory.rss_mib() <= during - BLOCK_MIB + COUNTER_SLACK_MIB
    assert peak_memory.max_rss_mib() >= during - COUNTER_SLACK_MIB
