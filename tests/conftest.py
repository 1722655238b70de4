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

from helpers.stack import STACK, XLA_SKIP_REASON  # noqa: E402

if STACK not in ('current', 'classic'):
    raise pytest.UsageError(f'the environment holds {STACK or "neither"} of the two stacks\' OpenMMLab packages; '
                            'set it up with `make setup` or `STACK=classic make setup`')


@pytest.fixture(scope='session')
def digits_root(tmp_path_factory):
    """The demo's digits dataset (1,797 32x32 PNGs), prepared once per pytest run."""
    from vit_plugin.datasets.digits import prepare_digits_dataset
    return prepare_digits_dataset(str(tmp_path_factory.mktemp('data') / 'digits'))


# Seconds each of the longest test files took on one of two workers (2-core machine, clean clone). `make test`
# hands out whole files in collection order (--dist loadfile --no-loadscope-reorder), so the longest go
# first and the run ends on short files instead of one worker finishing a long one while the other idles.
# A file not listed here is short; its place among the rest is unchanged.
FILE_SECONDS = {
    'test_detection.py': 260, 'test_xla_spmd.py': 190, 'test_fsdp2.py': 110, 'test_preemption.py': 150,
    'test_xla_train.py': 133, 'test_front_door.py': 114, 'test_training.py': 104, 'test_train_compile.py': 98,
    'test_mpp_study.py': 69, 'test_dataset_index.py': 66, 'test_numerics_guard.py': 64, 'test_bad_input.py': 63,
    'test_mim_comparison.py': 62, 'test_mmcv_ops.py': 62, 'test_configs.py': 59, 'test_vit.py': 47,
    'test_mpp_detection.py': 26, 'test_deploy.py': 24, 'test_benchmark_models.py': 24, 'test_xla.py': 21,
    'test_mpp.py': 20, 'test_hf_checkpoints.py': 30, 'test_stack.py': 60, 'test_compat.py': 20,
}


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))  # stable: a file's tests keep their order
    if STACK == 'current':
        for item in items:
            if item.get_closest_marker('xla'):
                item.add_marker(pytest.mark.skip(reason=XLA_SKIP_REASON))
