"""Shared test set-up.

torch_xla must initialise its runtime before the first CPU backward pass of the process
(pytorch/xla#4174), so when it is installed we initialise it here, before any test runs, on its CPU
backend. Tests that train through XLA then share this process safely.
"""
import os

os.environ.setdefault('PJRT_DEVICE', 'CPU')

try:
    import torch_xla  # noqa: E402

    torch_xla.device()  # initialise the PJRT runtime now
except ImportError:  # torch_xla is optional for users; the set-up installs it for the tests
    pass

import torch  # noqa: E402

# Two threads at most; fewer when pytest-xdist workers share the cores (`make test` starts one per core).
_workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _workers)))

import pytest  # noqa: E402


@pytest.fixture(scope='session')
def digits_root(tmp_path_factory):
    """The demo's digits dataset (1,797 32x32 PNGs), prepared once per pytest run."""
    from vit_plugin.datasets.digits import prepare_digits_dataset
    return prepare_digits_dataset(str(tmp_path_factory.mktemp('data') / 'digits'))
