"""A checkpoint file's format told by its first bytes, and safetensors with our ``meta`` under :data:`META_KEY`.

See docs/checkpoints.md#the-papers-weights-from-the-hugging-face-hub."""
import json
import os
import os.path as osp
import struct
import tempfile
import zipfile
from typing import Any, Dict, Optional, Tuple

import torch

#: safetensors metadata key of the JSON-encoded ``meta`` dict (source, model config, class names).
META_KEY = 'vit_plugin.meta'

#: What a checkpoint path may be, for error messages.
ACCEPTED_FORMATS = ('a PyTorch checkpoint (.pth/.pt/.bin), a safetensors file, an official JAX .npz, a folder '
                    'with config.json and model.safetensors (or pytorch_model.bin), or hf-hub:<org>/<name>')

#: Weight files looked for in a model folder (a Hugging Face snapshot), in order of preference:
#: safetensors first, because it cannot execute code.
FOLDER_WEIGHTS = ('model.safetensors', 'pytorch_model.bin', 'open_clip_pytorch_model.bin')

_SAFETENSORS_MAX_HEADER = 100 * 2**20  # the safetensors library's own limit


def _describe(head: bytes, size: int) -> str:
    """A few words saying what a file that is no checkpoint looks like."""
    if size == 0:
        return 'an empty file'
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError:
        return f'{size} bytes starting with {head[:16].hex(" ")}'
    if text.isprintable() or all(c.isprintable() or c.isspace() for c in text):
        shown = ' '.join(text.split())[:40]
        return f'a text file starting with {shown!r}'
    return f'{size} bytes starting with {head[:16].hex(" ")}'


class CheckpointFormatError(RuntimeError):
    """A file that is no checkpoint in any accepted format, or a truncated one."""


def _safetensors_header(filename: str, size: int) -> Dict[str, Any]:
    """The parsed header of a safetensors file, checked against the file's size."""
    with open(filename, 'rb') as f:
        (length, ) = struct.unpack('<Q', f.read(8))
        raw = f.read(length) if length <= _SAFETENSORS_MAX_HEADER else b''
    if length > size - 8 or len(raw) < length:
        raise CheckpointFormatError(
            f'{filename!r} is a truncated safetensors file: its header says {length} bytes, the file has '
            f'{size - 8} after the length field. Download or save it again.')
    try:
        header = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointFormatError(f'{filename!r} looks like a safetensors file but its header is not valid JSON '
                                    f'({err}). Download or save it again.') from None
    end = max((entry['data_offsets'][1] for name, entry in header.items() if name != '__metadata__'), default=0)
    if 8 + length + end > size:
        raise CheckpointFormatError(
            f'{filename!r} is a truncated safetensors file: its tensors end at byte {8 + length + end}, the file '
            f'has {size}. Download or save it again.')
    return header


def sniff_checkpoint(filename: str) -> str:
    """'safetensors', 'torch' or 'npz', from the file's content; raises FileNotFoundError, or
    CheckpointFormatError (no accepted format, a truncated safetensors file)."""
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint {filename!r} does not exist')
    size = osp.getsize(filename)
    with open(filename, 'rb') as f:
        head = f.read(64)
    if head.startswith(b'PK\x03\x04'):
        try:
            with zipfile.ZipFile(filename) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, EOFError):
            # a truncated archive has lost the directory that tells the two apart: the name decides,
            # and the reader of that format reports the truncation
            return 'npz' if filename.lower().endswith('.npz') else 'torch'
        return 'npz' if names and all(n.endswith('.npy') for n in names) else 'torch'
    if head[:1] == b'\x80':
        return 'torch'
    # the header length of any real file is small; the same bytes of a text file read as a huge number
    if len(head) >= 9 and head[8:9] == b'{' and struct.unpack('<Q', head[:8])[0] <= _SAFETENSORS_MAX_HEADER:
        _safetensors_header(filename, size)
        return 'safetensors'
    raise CheckpointFormatError(f'{filename!r} is not a checkpoint: it is {_describe(head, size)}.\n'
                                f'Accepted: {ACCEPTED_FORMATS}.')


def read_safetensors(filename: str, map_location: Any = 'cpu') -> Dict[str, Any]:
    """The tensors of a safetensors file, as ``{'state_dict', 'meta'}`` with our ``meta``; ``map_location``:
    a device, anything else loads to the CPU."""
    from safetensors import safe_open  # a dependency of timm and transformers; safe_open never runs code
    device = str(map_location) if isinstance(map_location, (str, torch.device)) else 'cpu'
    with safe_open(filename, framework='pt', device=device) as f:
        metadata = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    if META_KEY in metadata:
        return dict(state_dict=tensors, meta=json.loads(metadata[META_KEY]))
    return tensors


def write_safetensors(state_dict: Dict[str, torch.Tensor], dst: str, meta: Optional[Dict[str, Any]] = None,
                      metadata: Optional[Dict[str, str]] = None) -> None:
    """Write ``state_dict`` (contiguous copies) and ``meta`` as JSON to ``dst``, atomically."""
    from safetensors.torch import save_file
    bad = [k for k, v in state_dict.items() if not torch.is_tensor(v)]
    if bad:
        raise ValueError(f'cannot write {dst!r} as safetensors: {bad[:3]} are not tensors; safetensors holds '
                         f'tensors only (write a .pth instead)')
    tensors = {k: v.detach().to('cpu').contiguous().clone() for k, v in state_dict.items()}
    table = dict(format='pt', **(metadata or {}))
    if meta is not None:
        table[META_KEY] = json.dumps(meta, default=_json_default)
    directory = osp.dirname(osp.abspath(dst))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.' + osp.basename(dst) + '.', suffix='.partial', dir=directory)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=table)
        os.replace(tmp, dst)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def _json_default(value):
    if isinstance(value, (tuple, set)):
        return list(value)
    if torch.is_tensor(value):
        return value.tolist()
    return str(value)


def folder_weights(folder: str) -> Tuple[str, Optional[str]]:
    """(weights file, ``config.json`` or None) of a model folder; raises CheckpointFormatError without
    :data:`FOLDER_WEIGHTS`."""
    for name in FOLDER_WEIGHTS:
        path = osp.join(folder, name)
        if osp.isfile(path):
            config = osp.join(folder, 'config.json')
            return path, config if osp.isfile(config) else None
    found = sorted(os.listdir(folder))[:6]
    sharded = [n for n in found if n.endswith('.index.json')]
    why = (f'sharded weights ({sharded[0]}) are not supported; merge the shards into one file'
           if sharded else f'it holds {found or "nothing"}')
    raise CheckpointFormatError(f'{folder!r} is a folder without weights: looked for {", ".join(FOLDER_WEIGHTS)}; '
                                f'{why}.\nAccepted: {ACCEPTED_FORMATS}.')
