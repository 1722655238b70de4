"""Loading checkpoints without executing code from them; :func:`install` (run by ``import vit_plugin``)
routes mmengine's local and http(s) loads here (docs/installation.md#checkpoints-are-loaded-safely)."""
import hashlib
import os
import os.path as osp
import pickle
import zipfile
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import urlparse

import numpy as np
import torch
from mmengine.dist import get_dist_info
from mmengine.logging import HistoryBuffer, print_log
from mmengine.runner.checkpoint import CheckpointLoader

from vit_plugin.compat import numpy as numpy_compat

from .formats import CheckpointFormatError, folder_weights, read_safetensors, sniff_checkpoint
from .hub import HUB_PREFIX, HubCheckpointError, resolve_hub_checkpoint

TRUST_ENV = 'VIT_PLUGIN_TRUSTED_CHECKPOINTS'


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded; the message says which file, why and what to do."""


class CheckpointFileError(CheckpointError, CheckpointFormatError, HubCheckpointError):
    """A path that is no checkpoint in an accepted format, a truncated file, or an unresolvable hub id."""


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
    found = [np.ndarray, np.dtype]
    # numpy 2 moved numpy.core to numpy._core; files name whichever wrote them
    for func, obj in numpy_compat.pickle_reconstructors().items():
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
    """``torch.load`` that never runs code from the file, unless the user trusts that file.

    Raises:
        FileNotFoundError: The file does not exist.
        UnsafeCheckpointError: The file pickles objects outside the allowlist (e.g. code).
        CheckpointError: The file is truncated or not a PyTorch checkpoint.
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
            f'Refused to load {filename!r}: it pickles objects that are not plain weights ({detail}), which '
            f'could run code. If you trust it: `export {TRUST_ENV}={osp.realpath(filename)}`; or re-save only its '
            f'tensors, or convert it with tools/convert_checkpoint.py.') from None
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


#: Functions ``(checkpoint, weights_file, config_file or None) -> checkpoint`` applied to every
#: checkpoint read from a local path, in order of registration; each returns its input unchanged
#: unless it recognises the layout (e.g. ``transformers``' ViT, converted to ours).
STATE_DICT_ADAPTERS: List[Callable[[Any, str, Optional[str]], Any]] = []


def register_state_dict_adapter(adapter: Callable[[Any, str, Optional[str]], Any]) -> None:
    """Let ``init_cfg``/``load_from``/``--resume`` turn a third-party layout into ours as it loads."""
    if adapter not in STATE_DICT_ADAPTERS:
        STATE_DICT_ADAPTERS.append(adapter)


def read_checkpoint_file(filename: str, map_location: Optional[Any] = None) -> Any:
    """A local checkpoint file or model folder as stored (no adapter), its format told by content.

    Raises FileNotFoundError, CheckpointFileError (no accepted format, truncated), UnsafeCheckpointError."""
    filename = osp.expanduser(filename)
    if osp.isdir(filename):
        try:
            filename, _ = folder_weights(filename)
        except CheckpointFormatError as err:
            raise CheckpointFileError(str(err)) from None
    try:
        kind = sniff_checkpoint(filename)
    except CheckpointFormatError as err:
        raise CheckpointFileError(str(err)) from None
    if kind == 'npz':
        if '.npz' not in FORMAT_LOADERS:
            raise CheckpointFileError(f'{filename!r} is an .npz archive (official JAX weights); its reader comes '
                                      f'with vit_plugin.converters: import vit_plugin first.')
        return FORMAT_LOADERS['.npz'](filename, map_location)
    if kind == 'safetensors':
        return read_safetensors(filename, 'cpu' if map_location is None else map_location)
    return safe_torch_load(filename, 'cpu' if map_location is None else map_location)


def load_local_checkpoint(filename: str, map_location: Optional[Any] = None) -> Any:
    """mmengine loader for local paths: any accepted format or model folder, third-party layouts adapted."""
    weights, config = filename, None
    if osp.isdir(osp.expanduser(filename)):
        try:
            weights, config = folder_weights(osp.expanduser(filename))
        except CheckpointFormatError as err:
            raise CheckpointFileError(str(err)) from None
    elif osp.isfile(osp.join(osp.dirname(osp.abspath(osp.expanduser(filename))), 'config.json')):
        config = osp.join(osp.dirname(osp.abspath(osp.expanduser(filename))), 'config.json')
    for suffix, loader in FORMAT_LOADERS.items():  # a loader of its own for a suffix (e.g. '.npz')
        if weights.lower().endswith(suffix):
            return loader(weights, map_location)
    checkpoint = read_checkpoint_file(weights, map_location)
    for adapter in STATE_DICT_ADAPTERS:
        checkpoint = adapter(checkpoint, weights, config)
    return checkpoint


def load_hub_checkpoint(path: str, map_location: Optional[Any] = None) -> Any:
    """mmengine loader for ``hf-hub:<org>/<name>[@revision]``, through the Hugging Face cache."""
    try:
        folder = resolve_hub_checkpoint(path)
    except HubCheckpointError as err:
        raise CheckpointFileError(str(err)) from None
    return load_local_checkpoint(folder, map_location)


def is_checkpoint_path(path: str) -> bool:
    """Whether ``path`` names something a loader above may read: a file, a folder or a hub id."""
    return path.startswith(HUB_PREFIX) or osp.exists(osp.expanduser(path)) or '://' in path


def url_cache_path(url: str, model_dir: Optional[str] = None) -> str:
    """Where :func:`load_url_checkpoint` caches ``url``: a directory per URL (hash), the file's own name."""
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints', 'vit_plugin')
    address = url.split('#')[0]
    name = osp.basename(urlparse(address).path) or 'checkpoint'
    return osp.join(model_dir, hashlib.sha256(address.encode()).hexdigest()[:16], name)


def _download(url: str, cached: str, progress: bool) -> None:
    match = torch.hub.HASH_REGEX.search(osp.basename(cached))
    hash_prefix = match.group(1) if match else None
    directory = osp.dirname(cached)
    os.makedirs(directory, exist_ok=True)
    print_log(f'Downloading {url} to {cached}' + (f' (SHA-256 must start with {hash_prefix})' if hash_prefix
                                                  else ''), logger='current')
    try:  # writes a temporary file next to ``cached`` and renames it into place only when complete and valid
        torch.hub.download_url_to_file(url, cached, hash_prefix=hash_prefix, progress=progress)
    except BaseException as err:
        if osp.isdir(directory) and not os.listdir(directory):
            os.rmdir(directory)
        if isinstance(err, RuntimeError) and 'invalid hash value' in str(err):
            raise CheckpointError(
                f'Refused the download of {url}: its file name promises a SHA-256 starting with '
                f'{hash_prefix!r}, but the data does not match ({err}); nothing was cached. Download it again, '
                f'or download the file yourself and give its local path.') from None
        raise


def load_url_checkpoint(url: str, map_location: Optional[Any] = None, model_dir: Optional[str] = None) -> Any:
    """mmengine's http(s) loader: download once (hash prefix checked; local rank 0 while others wait), load."""
    cached = url_cache_path(url, model_dir)
    rank, world_size = get_dist_info()
    local_rank = int(os.environ.get('LOCAL_RANK', rank))
    if local_rank == 0 and not osp.isfile(cached):
        _download(url, cached, progress=rank == 0)
    if world_size > 1:
        torch.distributed.barrier()
        if local_rank != 0 and not osp.isfile(cached):  # e.g. a node-local cache that rank 0 cannot see
            _download(url, cached, progress=False)
    return load_local_checkpoint(cached, map_location)


def install() -> None:
    """Make mmengine load local and http(s) checkpoints through the safe loaders, process-wide (idempotent)."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint, force=True)
    CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=load_url_checkpoint, force=True)
    CheckpointLoader.register_scheme(prefixes=HUB_PREFIX, loader=load_hub_checkpoint, force=True)
