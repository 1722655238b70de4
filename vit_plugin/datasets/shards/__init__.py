"""The bytes of tar shards, local or remote: where they are, listings and versions, scans and random
access. One concern per module, each below the next (docs/data.md#remote-shards):

- :mod:`.errors`: :class:`ShardReadError` and its kinds;
- :mod:`.locations`: local paths, fsspec URLs, ``hf://`` and the Hugging Face cache;
- :mod:`.remote`: one ranged GET, with the retries of a :class:`RetryPolicy`;
- :mod:`.listing`: folder listings, fingerprints, small files;
- :mod:`.local`: ``pread`` on an LRU of open descriptors;
- :mod:`.chunk_cache`: the node's on-disk chunk cache, its read-ahead threads and eviction;
- :mod:`.reader`: :class:`ShardReader`, random access for the dataset;
- :mod:`.scan`: :func:`open_for_scan`, sequential reads for the index build.
"""
from .chunk_cache import default_cache_dir
from .errors import (HubOfflineError, RangesNotSupportedError, ShardNotFoundError, ShardReadError,
                     ShardUnavailableError)
from .listing import (FolderListing, compressed_tars_in_folder, fingerprint, fingerprints_in_folder, list_folder,
                      list_shards_in_folder, read_small_file)
from .locations import (COMPRESSED_TAR_SUFFIXES, HfPath, hf_cached_path, hf_cached_snapshot, is_compressed_tar,
                        is_remote, join_url, local_path, resolve_hf_url)
from .reader import ShardReader
from .remote import DEFAULT_RETRY, RetryPolicy
from .scan import open_for_scan

__all__ = ['COMPRESSED_TAR_SUFFIXES', 'DEFAULT_RETRY', 'FolderListing', 'HfPath', 'HubOfflineError',
           'RangesNotSupportedError', 'RetryPolicy', 'ShardNotFoundError', 'ShardReadError', 'ShardReader',
           'ShardUnavailableError', 'compressed_tars_in_folder', 'default_cache_dir', 'fingerprint',
           'fingerprints_in_folder', 'hf_cached_path', 'hf_cached_snapshot', 'is_compressed_tar', 'is_remote',
           'join_url', 'list_folder', 'list_shards_in_folder', 'local_path', 'open_for_scan', 'read_small_file',
           'resolve_hf_url']
