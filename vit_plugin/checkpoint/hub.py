"""``hf-hub:<org>/<name>[@revision]`` paths through ``huggingface_hub``, cache and offline mode read at each call."""
import os
import os.path as osp
from typing import Optional, Tuple

from .formats import FOLDER_WEIGHTS

HUB_PREFIX = 'hf-hub:'


class HubCheckpointError(RuntimeError):
    """A hub checkpoint could not be found; the message names the repository and what to do."""


def parse_hub_path(path: str) -> Tuple[str, Optional[str]]:
    """``'hf-hub:org/name@rev'`` -> ``('org/name', 'rev')`` (revision None when not given)."""
    spec = path[len(HUB_PREFIX):] if path.startswith(HUB_PREFIX) else path
    repo_id, _, revision = spec.partition('@')
    if repo_id.count('/') != 1 or not all(repo_id.split('/')):
        raise HubCheckpointError(f'{path!r}: expected hf-hub:<org>/<name> or hf-hub:<org>/<name>@<revision>, '
                                 f'e.g. hf-hub:google/vit-base-patch16-224-in21k')
    return repo_id, revision or None


def hub_cache_dir() -> str:
    """The Hugging Face hub cache, read from the environment now (``HF_HUB_CACHE``, else ``HF_HOME``/hub)."""
    if os.environ.get('HF_HUB_CACHE'):
        return osp.expanduser(os.environ['HF_HUB_CACHE'])
    home = os.environ.get('HF_HOME') or osp.join(os.environ.get('XDG_CACHE_HOME', osp.expanduser('~/.cache')),
                                                 'huggingface')
    return osp.join(osp.expanduser(home), 'hub')


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) forbids downloads, read now."""
    value = os.environ.get('HF_HUB_OFFLINE') or os.environ.get('TRANSFORMERS_OFFLINE') or ''
    return value.strip().lower() in ('1', 'on', 'yes', 'true')


def resolve_hub_checkpoint(path: str) -> str:
    """The local snapshot folder with the weights (safetensors first) of ``hf-hub:<org>/<name>``.

    Raises HubCheckpointError: ``huggingface_hub`` missing, repository, revision or weights not found, or
    offline without the files in the cache."""
    repo_id, revision = parse_hub_path(path)
    try:  # optional dependency: only hub paths need it
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import (EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                           RevisionNotFoundError)
    except ImportError:
        raise HubCheckpointError(f'{path}: hub checkpoints need huggingface_hub; pip install huggingface_hub, '
                                 f'or download the files and give their folder.') from None
    cache, offline = hub_cache_dir(), hub_offline()
    where = f'{repo_id}' + (f'@{revision}' if revision else '')
    download = dict(repo_id=repo_id, revision=revision, cache_dir=cache, local_files_only=offline)
    try:
        weights = None
        for name in FOLDER_WEIGHTS:
            try:
                weights = hf_hub_download(filename=name, **download)
                break
            except EntryNotFoundError:  # online: the repository has no file of that name
                continue
            except LocalEntryNotFoundError:  # offline (or unreachable): not in the cache
                if offline:
                    continue
                raise
        if weights is None:
            if offline:
                raise HubCheckpointError(
                    f'hf-hub:{where}: not in the local Hugging Face cache ({cache}), and HF_HUB_OFFLINE=1.\n'
                    f'Run `huggingface-cli download {repo_id}` online, or check the name and revision.')
            raise HubCheckpointError(f'hf-hub:{where} has none of {", ".join(FOLDER_WEIGHTS)}; it is no PyTorch '
                                     f'model repository (pick one of the timm/ or google/vit-* ports).')
        try:
            hf_hub_download(filename='config.json', **download)
        except (EntryNotFoundError, LocalEntryNotFoundError):
            pass  # a bare weights repository: the layout is read from the keys
    except RepositoryNotFoundError:
        raise HubCheckpointError(f'hf-hub:{where}: repository {repo_id!r} not found (or private). Check the '
                                 f'name; for a private or gated one, run `huggingface-cli login`.') from None
    except RevisionNotFoundError:
        raise HubCheckpointError(f'hf-hub:{where}: repository {repo_id!r} has no revision {revision!r}. Check the '
                                 f'branch, tag or commit (hf-hub:{repo_id} takes main).') from None
    except LocalEntryNotFoundError as err:  # online mode, but the hub could not be reached
        raise HubCheckpointError(f'hf-hub:{where}: the hub could not be reached and the files are not cached in '
                                 f'{cache} ({type(err).__name__}).\nConnect, or run `huggingface-cli download '
                                 f'{repo_id}` where you can and copy the cache.') from None
    return osp.dirname(weights)
