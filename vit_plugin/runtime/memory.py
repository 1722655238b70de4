"""The collector's view of the heap while forked workers share it."""
import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Moves every object the collector tracks to its permanent generation for the length of the block.

    Objects the collector never visits are never written to, so children forked inside the block share
    the parent's heap pages instead of copying them (docs/data.md). The heap is unfrozen when the block
    ends, also on an error, unless it was frozen already when the block began: then the objects stay
    frozen, as the caller who froze them expects.
    """
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()
