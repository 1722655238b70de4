"""An alias of :mod:`vit_plugin.datasets.shards`, kept so that ``vit_plugin.datasets.shard_files`` and
every public name it had keep working; the code lives in the sub-package's modules
(docs/data.md#remote-shards)."""
from .shards import *  # noqa: F401,F403
from .shards import __all__  # noqa: F401
from .shards.locations import HF_REPO_TYPES, LOCAL_PROTOCOLS  # noqa: F401
from .shards.reader import DEFAULT_CACHE_BYTES, DEFAULT_CHUNK_BYTES, DEFAULT_READAHEAD_CHUNKS  # noqa: F401
from .shards.remote import (DEFAULT_BACKOFF_S, DEFAULT_MAX_BACKOFF_S, DEFAULT_RETRIES,  # noqa: F401
                            DEFAULT_RETRY_TIMEOUT_S)
from .shards.scan import DEFAULT_SCAN_BLOCK_BYTES  # noqa: F401
