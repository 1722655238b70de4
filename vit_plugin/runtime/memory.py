"""The collector's view of the heap while forked workers share it."""
import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap for the block (forked children share its pages); unfrozen after, unless frozen before."""
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()
