"""The errors of a shard read: every one a :class:`ShardReadError` (an ``OSError``) that names the URL
and what to do (docs/data.md#remote-shards)."""
from typing import Optional


class ShardReadError(OSError):
    """A shard, a byte range of it, or a folder of shards cannot be read.

    Attributes:
        url: what was read.
        reason: what went wrong, with what to do.
    """

    def __init__(self, url: str, reason: str = ''):
        self.url = url
        self.reason = reason
        super().__init__(f'{url}: {reason}' if reason else url)

    def __reduce__(self):  # the (url, reason) pair survives pickling (dataloader workers)
        return type(self), (self.url, self.reason)


class ShardNotFoundError(ShardReadError, FileNotFoundError):
    """The file (or folder) does not exist."""


class HubOfflineError(ShardReadError):
    """An hf:// file that is not in the local Hugging Face cache while the hub is offline or unreachable."""


class ShardUnavailableError(ShardReadError):
    """A transient error (network, timeout, HTTP 5xx or 429) that outlasted the retry policy's ``timeout_s``."""


class RangesNotSupportedError(ShardReadError):
    """The server answers a byte-range request with the whole file (HTTP 200, not 206 Partial Content)."""


def not_found(url: str, what: str = '') -> ShardNotFoundError:
    if what == 'folder':
        return ShardNotFoundError(url, 'folder not found. Check data_root (or the shard folder).')
    return ShardNotFoundError(url, 'not found. Check the path (data_root, the shard list or pattern).')


def os_error(url: str, err: OSError) -> ShardReadError:
    return ShardReadError(url, f'{err.strerror}.')


def truncated(url: str, offset: int, length: int, available: int) -> ShardReadError:
    return ShardReadError(url, f'truncated: bytes {offset}-{offset + length} were asked for, the file ends at '
                               f'{available}. Download the shard again: a changed shard is indexed again '
                               f'at the next start (docs/data.md#the-index).')


def no_ranges(url: str, status: Optional[int]) -> RangesNotSupportedError:
    return RangesNotSupportedError(
        url, f'the server answers a byte-range request with HTTP {status} and the whole file, not 206 '
             f'Partial Content.\nServe the shards from a server with Range support (docs/data.md#remote-shards), '
             f'or download them and point data_root at the local folder.')


def cache_error(url: str, folder: str, err: OSError) -> ShardReadError:
    return ShardReadError(url, f'cannot write the chunk cache in {folder} ({err.strerror or err}). Free '
                               f'space there, or give the reader a cache_dir on a writable local disk.')
