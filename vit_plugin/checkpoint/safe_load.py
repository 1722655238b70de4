"""Loading checkpoints without executing code from them, on torch >= 2.6.

Every checkpoint that mmengine reads from a local path or a URL -- ``init_cfg=dict(type='Pretrained')``,
``load_from``, ``--resume`` -- goes through :func:`safe_torch_load` once ``vit_plugin`` is imported:
``torch.load(weights_only=True)`` plus a short allowlist of the harmless data types mmengine itself
writes into runner checkpoints (its ``HistoryBuffer`` log statistics and numpy arrays/scalars). That is
what makes ``--resume`` work on torch 2.9 without the global ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
switch, while a file that pickles code is refused before anything in it runs.

A user who trusts a specific file that needs full unpickling opts in for that file only by listing
its path in the environment variable ``VIT_PLUGIN_TRUSTED_CHECKPOINTS`` (``os.pathsep``-separated).
"""
import os
import os.path as osp
import pickle
import zipfile
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
from mmengine.logging import HistoryBuffer, print_log
from mmengine.runner.checkpoint import CheckpointLoader

TRUST_ENV = 'VIT_PLUGIN_TRUSTED_CHECKPOINTS'


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded; the message says which file, why and what to do."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """The checkpoint asks the unpickler to import or call something outside the allowlist."""


def _history_buffer_getattr(obj, name):
    # mmengine pickles HistoryBuffer's statistics table as ``getattr(HistoryBuffer, 'mean')`` etc.
    # Allowing the builtin ``getattr`` would let a file reach any attribute of any allowed object, so
    # the unpickler gets this narrow stand-in instead.
    if obj is HistoryBuffer and name in ('min', 'max', 'current', 'mean'):
        return getattr(obj, name)
    raise pickle.UnpicklingError(f'refusing getattr({obj!r}, {name!r}) while loading a checkpoint')


def _numpy_globals():
    try:  # numpy 2 moved numpy.core to numpy._core; files name whichever wrote them
        from numpy._core import multiarray
    except ImportError:
        from numpy.core import multiarray
    found = [np.ndarray, np.dtype]
    for func in ('_reconstruct', 'scalar'):
        obj = getattr(multiarray, func)
        found += [(obj, f'numpy.core.multiarray.{func}'), (obj, f'numpy._core.multiarray.{func}')]
    found += [type(np.dtype(t)) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                          np.uint32, np.uint64, np.float16, np.float32, np.float64,
                                          np.complex64, np.complex128)]
    return found


#: Globals a weights-only load may resolve: everything mmengine 0.10.7 writes into a runner checkpoint.
SAFE_GLOBALS = [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr'), *_numpy_globals()]


def trusted_paths():
    """Absolute paths the user explicitly trusts for full (code-executing) unpickling."""
    value = os.environ.get(TRUST_ENV, '')
    return {osp.realpath(osp.expanduser(p)) for p in value.split(os.pathsep) if p}


def safe_torch_load(filename: str, map_location: Any = 'cpu') -> Any:
    """``torch.load`` that never runs code from the file (unless the user trusts that file).

    Args:
        filename (str): Local path.
        map_location: As for :func:`torch.load`. Defaults to 'cpu'.

    Raises:
        FileNotFoundError: the file does not exist.
        UnsafeCheckpointError: the file pickles objects outside the allowlist (e.g. code).
        CheckpointError: the file is truncated or not a PyTorch checkpoint.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint {filename!r} does not exist')
    if osp.realpath(filename) in trusted_paths():
        print_log(f'Loading {filename} with full unpickling because it is listed in ${TRUST_ENV}.',
                  logger='current')
        return torch.load(filename, map_location=map_location, weights_only=False)
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        detail = str(err).split('WeightsUnpickler error:')[-1].strip().splitlines()[0]
        raise UnsafeCheckpointError(
            f'Refused to load {filename!r}: it contains pickled objects that are not plain weights '
            f'({detail}). Loading it could execute code from the file, so nothing from it was run. '
            f'If you trust this file, opt in for it alone with '
            f'`export {TRUST_ENV}={osp.realpath(filename)}`, or better, re-save only its tensors '
            f'(torch.save(state_dict) from a trusted session) or convert it with '
            f'tools/convert_checkpoint.py.') from None
    except (RuntimeError, EOFError, zipfile.BadZipFile) as err:
        raise CheckpointError(
            f'Could not read {filename!r} as a PyTorch checkpoint ({type(err).__name__}: '
            f'{str(err).splitlines()[0]}). The file may be truncated (an interrupted download or save) '
            f'or in another format; download or save it again, or convert it with '
            f'tools/convert_checkpoint.py.') from None


#: File suffix -> loader for checkpoint formats other than torch pickles (e.g. '.npz' official JAX
#: checkpoints, registered by :mod:`vit_plugin.converters`).
FORMAT_LOADERS: Dict[str, Callable[[str, Any], Any]] = {}


def register_checkpoint_format(suffix: str, loader: Callable[[str, Any], Any]) -> None:
    """Let ``init_cfg``/``load_from``/``--resume`` read files ending in ``suffix`` with ``loader``."""
    FORMAT_LOADERS[suffix.lower()] = loader


def load_local_checkpoint(filename: str, map_location: Optional[Any] = None) -> Any:
    """mmengine checkpoint-loader scheme for local paths (replaces mmengine's unsafe default)."""
    for suffix, loader in FORMAT_LOADERS.items():
        if filename.lower().endswith(suffix):
            return loader(filename, map_location)
    return safe_torch_load(filename, map_location)


def load_url_checkpoint(url: str, map_location: Optional[Any] = None, model_dir: Optional[str] = None) -> Any:
    """mmengine checkpoint-loader scheme for http(s) URLs: download once into the torch hub cache, then
    load like a local file."""
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(model_dir, exist_ok=True)
    cached = osp.join(model_dir, osp.basename(url.split('?')[0]))
    if not osp.isfile(cached):
        partial = cached + '.partial'
        torch.hub.download_url_to_file(url, partial, progress=True)
        os.replace(partial, cached)
    return load_local_checkpoint(cached, map_location)


def install() -> None:
    """Make mmengine load local and http(s) checkpoints through the safe loaders (idempotent)."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint, force=True)
    CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=load_url_checkpoint, force=True)
