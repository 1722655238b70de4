"""Training in the test process the way the tests' training subprocesses train (``helpers.common.run_env``),
so that its losses can be compared with theirs: one thread, the recorder hooks the configs import by their
bare names (``custom_imports``), and ``LOCAL_RANK``; all restored afterwards."""
import contextlib
import importlib
import sys

import pytest
import torch


@contextlib.contextmanager
def one_thread():
    """One intra-op thread for the duration, as ``OMP_NUM_THREADS=1`` gives a subprocess."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def like_a_subprocess(*recorders: str):
    """``recorders``: the bare names (``'loss_recorder'``) of the helper modules the configs import; each
    names the ``helpers.`` module, so that its hook is registered once in this process."""
    with pytest.MonkeyPatch.context() as patch, one_thread():
        for name in recorders:
            patch.setitem(sys.modules, name, importlib.import_module(f'helpers.{name}'))
        patch.setenv('LOCAL_RANK', '0')
        yield
