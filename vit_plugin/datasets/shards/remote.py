"""The remote reader: one byte-range GET (fsspec, http(s), the hub), retried through transient errors
with exponential back-off and jitter; what cannot heal fails at once (docs/data.md#remote-shards)."""
import logging
import random
import time
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

from mmengine.logging import print_log

from vit_plugin.runtime.file_systems import file_system

from .errors import ShardReadError, ShardUnavailableError, no_ranges, not_found
from .locations import HfPath, hf_endpoint, hf_unavailable, is_hf, protocol, resolve_hf_url

DEFAULT_RETRIES = None  # no cap on the count of tries: retry_timeout bounds them
DEFAULT_BACKOFF_S = 0.5
DEFAULT_MAX_BACKOFF_S = 60.0
DEFAULT_RETRY_TIMEOUT_S = 600.0


class RetryPolicy(NamedTuple):
    """How long remote reads wait out transient errors (network, timeout, HTTP 5xx or 429).

    Wait n (from 0) is ``min(max_backoff_s, backoff_s * 2 ** n)`` times a random 0.5-1; the waits end
    ``timeout_s`` after the first failure, or after ``retries`` retries when that is set.
    """
    timeout_s: float = DEFAULT_RETRY_TIMEOUT_S
    backoff_s: float = DEFAULT_BACKOFF_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    retries: Optional[int] = DEFAULT_RETRIES

    def delay(self, step: int) -> float:
        """The wait before retry ``step`` (0 for the first), jitter included."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** min(step, 60)) * random.uniform(0.5, 1.0)


DEFAULT_RETRY = RetryPolicy()


class BeyondEnd(Exception):
    """A range that starts at or past the end of the file (HTTP 416)."""


def _status(err: BaseException) -> Optional[int]:
    """The HTTP status of an aiohttp (fsspec's http) or requests (huggingface_hub) error; None for others."""
    try:
        import aiohttp
        if isinstance(err, aiohttp.ClientResponseError):
            return err.status
    except ImportError:
        pass
    try:
        import requests
        if isinstance(err, requests.HTTPError) and err.response is not None:
            return err.response.status_code
    except ImportError:
        pass
    return None


def _transient_errors() -> Tuple[type, ...]:
    found: List[type] = [ConnectionError, TimeoutError]
    try:
        import aiohttp
        found.append(aiohttp.ClientError)
    except ImportError:
        pass
    try:
        import requests
        found += [requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError]
    except ImportError:
        pass
    return tuple(found)


def _permanent(url: str, err: BaseException) -> Optional[BaseException]:
    """The error to raise at once for ``err`` (no retry can help), or None for a transient one."""
    status = _status(err)
    if status == 416:
        return BeyondEnd()
    if isinstance(err, FileNotFoundError) or status in (404, 410):
        return not_found(url)
    if isinstance(err, PermissionError) or status in (401, 403):
        return ShardReadError(url, 'permission denied (or a private, gated or missing repository): check the '
                                   'name and the credentials (`huggingface-cli login`, AWS_PROFILE...).')
    if status is not None and 400 <= status < 500 and status not in (408, 425, 429):
        return ShardReadError(url, f'HTTP {status} ({_brief(err)}).')
    if isinstance(err, ImportError):  # fsspec names the package a protocol needs
        return ShardReadError(url, f'{err}')
    if status is None and not isinstance(err, _transient_errors()):
        return ShardReadError(url, _brief(err))
    return None


def _brief(err: BaseException, limit: int = 160) -> str:
    """``'Type: message'`` cut to ``limit`` characters: a network library's message can run long."""
    text = f'{type(err).__name__}: {err}'.replace('\n', ' ')
    return text if len(text) <= limit else text[:limit - 3] + '...'


def with_retries(url: str, call: Callable[[], Any], retry: Optional[RetryPolicy] = None,
                 quiet: bool = False) -> Any:
    """``call()``, again after each transient error, with the back-off of ``retry`` (default
    :data:`DEFAULT_RETRY`); each wait logs one line unless ``quiet``.

    Raises:
        ShardReadError: a permanent error (at once).
        ShardUnavailableError: a transient error that lasted past ``retry.timeout_s``.
        BeyondEnd: the range starts past the end of the file.
    """
    retry = retry or DEFAULT_RETRY
    deadline = None
    step = 0
    while True:
        try:
            return call()
        except ShardReadError:
            raise
        except Exception as err:  # noqa: BLE001 (sorted into permanent and transient below)
            permanent = _permanent(url, err)
            if permanent is not None:
                raise permanent from err
            now = time.monotonic()
            if deadline is None:
                deadline, first = now + retry.timeout_s, now
            left = deadline - now
            if left <= 0 or (retry.retries is not None and step >= retry.retries):
                raise ShardUnavailableError(
                    url, f'{_brief(err)} ({step + 1} tries over {now - first:.0f} s; retry_timeout='
                         f'{retry.timeout_s:g}). Check the network and the store, then resume the run (--resume).'
                ) from err
            delay = min(retry.delay(step), left)
            if not quiet:
                print_log(f'{url}: {_brief(err, 100)}; trying again in {delay:.1f} s (waited {now - first:.0f} s '
                          f'of retry_timeout={retry.timeout_s:g})', logger='current', level=logging.WARNING)
            time.sleep(delay)
            step += 1


def hf_call(url: str, hf: HfPath, call: Callable[[], Any], retry: Optional[RetryPolicy] = None,
            quiet: bool = False) -> Any:
    """:func:`with_retries` for the hub: an unreachable hub is the error that says how to download."""
    try:
        return with_retries(url, call, retry, quiet)
    except ShardReadError as err:
        cause = err.__cause__
        if cause is not None and _status(cause) is None and isinstance(cause, _transient_errors()):
            raise hf_unavailable(url, hf, f'the hub cannot be reached ({type(cause).__name__})') from cause
        raise


def hf_fetch(hf: HfPath, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
    """One GET of a hub file (bytes ``[start, end)`` of it when given)."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status
    headers = build_hf_headers()
    if start is not None:
        headers['Range'] = f'bytes={start}-{end - 1}'
    url = hf_hub_url(hf.repo_id, hf.path_in_repo, repo_type=hf.repo_type, revision=hf.revision,
                     endpoint=hf_endpoint())
    ranged = start is not None
    response = get_session().get(url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, stream=ranged)
    try:
        hf_raise_for_status(response)
        length = response.headers.get('Content-Length')
        if ranged and response.status_code != 206 and not (start == 0 and length and int(length) <= end):
            raise no_ranges(url, response.status_code)
        return response.content
    finally:
        response.close()


def _http_range(fs, path: str, url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of an http(s) file: one ``Range`` GET whose answer must be ``206`` (or ``200``
    with no more than the range); a ``200`` with the whole file is refused before its body is read."""
    from fsspec.asyn import sync

    async def get():
        client = await fs.set_session()  # aiohttp's ClientSession
        kwargs = dict(fs.kwargs)
        headers = dict(kwargs.pop('headers', None) or {})
        headers['Range'] = f'bytes={start}-{end - 1}'
        async with client.get(fs.encode_url(path), headers=headers, **kwargs) as response:
            if response.status == 404:
                raise FileNotFoundError(url)
            response.raise_for_status()  # aiohttp's error, with the status _permanent sorts
            length = response.content_length
            if response.status != 206 and not (start == 0 and length is not None and length <= end - start):
                raise no_ranges(url, response.status)
            return await response.read()
    return sync(fs.loop, get)


def fetch_range(url: str, start: int, end: int, retry: Optional[RetryPolicy] = None,
                quiet: bool = False) -> bytes:
    """Bytes ``[start, end)`` of a remote file (fewer at its end): one range request, plus retries.

    Raises:
        RangesNotSupportedError: the store answered with more than the range (it ignores ``Range``).
        ShardReadError: as :func:`with_retries`.
    """
    try:
        if is_hf(url):
            hf = resolve_hf_url(url)
            data = hf_call(url, hf, lambda: hf_fetch(hf, start, end), retry, quiet)
        else:
            fs, path = fsspec_path(url)
            if protocol(url) in ('http', 'https'):
                data = with_retries(url, lambda: _http_range(fs, path, url, start, end), retry, quiet)
            else:
                data = with_retries(url, lambda: fs.cat_file(path, start=start, end=end), retry, quiet)
    except BeyondEnd:
        return b''
    if len(data) > end - start:  # a store that ignores the range: refused before a second such transfer
        raise no_ranges(url, 200)
    return data


def fsspec_path(url: str):
    """(file system, path) of a remote, non-hf URL; the file system is this process's
    (:func:`vit_plugin.runtime.file_systems.file_system`), a chained URL's fsspec's own."""
    import fsspec  # optional: only remote shards need it
    try:
        if '::' in url:  # a chained URL (e.g. simplecache::s3://...)
            return fsspec.core.url_to_fs(url)
        return file_system(fsspec.core.split_protocol(url)[0]), fsspec.core.strip_protocol(url)
    except ImportError as err:
        raise ShardReadError(url, f'{err}') from None
    except ValueError as err:  # an unknown protocol
        raise ShardReadError(url, f'{err}; install the fsspec implementation of this protocol.') from None
