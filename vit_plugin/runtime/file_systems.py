"""This process's fsspec file systems, one per protocol, made at first use and kept while the process
lives, with the at-fork hook that sets a forked child's copies aside, unused and never closed (closing
them would take the parent's sockets out of the epoll set they share: docs/data.md#remote-shards)."""
from typing import Any, Dict, List

from .process import install_fork_hook

#: protocol -> this process's file system (made with ``skip_instance_cache``: only this module holds it).
_FILE_SYSTEMS: Dict[str, Any] = {}
#: A forked child's copies of its parent's file systems: kept, never used, never closed.
_INHERITED: List[Any] = []
_FORK_HOOK = 'vit_plugin.runtime.file_systems:set_aside_in_child'


def _set_aside_in_child() -> None:
    _INHERITED.extend(_FILE_SYSTEMS.values())
    _FILE_SYSTEMS.clear()


def file_system(protocol: str) -> Any:
    """This process's fsspec file system for ``protocol``; ``ImportError`` without the protocol's package
    (s3fs, gcsfs, aiohttp...), ``ValueError`` for a protocol fsspec does not know."""
    fs = _FILE_SYSTEMS.get(protocol)
    if fs is None:
        import fsspec  # optional: only remote shards need it
        fs = fsspec.filesystem(protocol, skip_instance_cache=True)
        install_fork_hook(_FORK_HOOK, _set_aside_in_child)
        _FILE_SYSTEMS[protocol] = fs
    return fs
