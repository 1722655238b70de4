"""Which of the two stacks this environment holds (standard library only; docs/installation.md#two-stacks)."""
import importlib
import importlib.metadata
import importlib.util
import shutil
import subprocess

#: The distributions of each stack, by the import name they provide.
DISTRIBUTIONS = {
    'current': {'mmengine': 'onedl-mmengine', 'mmcv': 'onedl-mmcv', 'mmpretrain': 'onedl-mmpretrain',
                'mmdet': 'onedl-mmdetection'},
    'classic': {'mmengine': 'mmengine', 'mmcv': ('mmcv', 'mmcv-lite'), 'mmpretrain': 'mmpretrain', 'mmdet': 'mmdet'},
}
REQUIRED_MODULES = ('mmengine', 'mmcv', 'mmpretrain', 'mmdet')

INSTALL_HINT = (
    "pip install 'vit_plugin[onedl]' (maintained forks) or 'vit_plugin[openmmlab,lite]' (with torch_xla);\n"
    'from a checkout: make setup, or STACK=classic make setup (docs/installation.md#two-stacks).')

#: The oldest NVIDIA Linux driver each CUDA major version of PyPI's torch wheels runs on (CUDA minor-version
#: compatibility: a driver of the major's first release runs every later minor release's wheels).
MIN_DRIVER = {'12': '525.60.13', '13': '580.65.06'}


def _installed(name):
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def stack_of_environment():
    """``'current'``, ``'classic'``, ``'mixed'`` (distributions of both) or None (neither)."""
    found = set()
    for stack, dists in DISTRIBUTIONS.items():
        for names in dists.values():
            if any(_installed(name) for name in ((names,) if isinstance(names, str) else names)):
                found.add(stack)
    if len(found) > 1:
        return 'mixed'
    return found.pop() if found else None


def require_openmmlab():
    """Raises ImportError naming both ways to install when an OpenMMLab package vit_plugin needs is absent."""
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed; vit_plugin "
                          f'needs mmengine, mmcv, mmpretrain and mmdet.\n{INSTALL_HINT}')


def _nvidia_smi_gpus():
    """``[(name, driver)]`` of the GPUs ``nvidia-smi`` lists; empty without it or without GPUs."""
    if shutil.which('nvidia-smi') is None:
        return []
    try:
        out = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version', '--format=csv,noheader'],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [tuple(part.strip() for part in line.split(',', 1)) for line in out.stdout.splitlines()
            if ',' in line]


def _version_key(version):
    return tuple(int(part) if part.isdigit() else 0 for part in version.split('.'))


def describe_gpu_access(gpus=None):
    """One line on whether torch can use the NVIDIA ``gpus`` (default: ``nvidia-smi``'s), or None if none."""
    import torch
    gpus = _nvidia_smi_gpus() if gpus is None else gpus
    if not gpus:
        return None
    names = ', '.join(sorted({name for name, _ in gpus}))
    drivers = ', '.join(sorted({driver for _, driver in gpus}))
    cuda = torch.version.cuda
    if torch.cuda.is_available():
        return f'GPUs: {len(gpus)} x {names} (driver {drivers}), used by torch {torch.__version__} (CUDA {cuda})'
    if cuda is None:
        why = f'torch {torch.__version__} is a CPU-only build'
    else:
        need = MIN_DRIVER.get(cuda.split('.')[0])
        oldest = min((driver for _, driver in gpus), key=_version_key)
        if need and _version_key(oldest) < _version_key(need):
            why = (f'torch {torch.__version__} is built for CUDA {cuda}, which needs NVIDIA driver >= {need}: '
                   'update the driver')
        else:
            why = (f'torch {torch.__version__} (CUDA {cuda}) finds no usable device with this driver; check '
                   'CUDA_VISIBLE_DEVICES and that the process can open /dev/nvidia*')
    return (f'warning: this host has {len(gpus)} GPU(s) ({names}, driver {drivers}) that torch cannot use: '
            f'{why} (docs/installation.md#gpus-and-drivers).')
