"""A small HTTP file server on 127.0.0.1, for the tests and benchmarks of remote shard reading.

:func:`serve_folder` serves one folder (read-only) on a free port of the loopback address and stops
when its ``with`` block ends. It answers what fsspec's ``HTTPFileSystem`` (and so
:mod:`vit_plugin.datasets.shards`) asks of a real server:

* ``HEAD`` and ``GET`` of a file, with ``Content-Length``, ``ETag`` and ``Last-Modified``;
* one ``Range: bytes=a-b`` (or ``a-`` or ``-n``) per request, answered with ``206`` and
  ``Content-Range``; a range that starts past the end gets ``416``;
* a folder as a plain HTML page of links (sub-folders end with ``/``), which fsspec lists;
* an optional latency added to every request (``delay_s``; the benchmark's remote case uses 20 ms),
  slept in the request's own thread so that parallel requests overlap as on a real network.

:class:`LoopbackServer` counts what it served (``requests``, ``bytes_sent``, and a log of
``(method, path, range)``) so that a test can assert how many requests a read cost, and can inject
faults into the next ``GET`` requests (``'cut'``: the body stops half-way and the connection closes;
an int: that HTTP status) to test retries and interrupted transfers, or answer every request with a fault
for a while (:meth:`LoopbackServer.outage`: a status, or ``'drop'``, the connection closed unanswered).
``ranges=False`` makes a server that ignores ``Range`` and answers ``200`` with the whole file, as Python's
``http.server`` does. Nothing else is reachable: the server binds 127.0.0.1 only, and serves no path
outside its folder.
"""
import contextlib
import email.utils
import html
import os
import os.path as osp
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, List, NamedTuple, Optional, Sequence, Union

_RANGE = re.compile(r'^bytes=(\d*)-(\d*)$')
_COPY_BLOCK = 1 << 20


class Request(NamedTuple):
    method: str
    path: str  # the URL path, decoded
    range: Optional[str]  # the Range header as sent, None without one


class LoopbackServer:
    """The running server of :func:`serve_folder`: its ``url`` and what it served."""

    def __init__(self, folder: str, delay_s: float = 0.0, ranges: bool = True):
        self.folder = osp.realpath(folder)
        self.delay_s = delay_s
        self.ranges = ranges
        self._outage_until = 0.0
        self._outage_fault: Union[str, int] = 503
        self._lock = threading.Lock()
        self._log: List[Request] = []
        self._bytes_sent = 0
        self._faults: List[Union[str, int]] = []
        self._httpd = ThreadingHTTPServer(('127.0.0.1', 0), _handler_class(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs=dict(poll_interval=0.05),
                                        name='loopback-http', daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, without a trailing slash."""
        return f'http://127.0.0.1:{self._httpd.server_address[1]}'

    @property
    def requests(self) -> int:
        with self._lock:
            return len(self._log)

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return self._bytes_sent

    @property
    def log(self) -> List[Request]:
        with self._lock:
            return list(self._log)

    def reset_counts(self) -> None:
        with self._lock:
            self._log.clear()
            self._bytes_sent = 0

    def inject_faults(self, faults: Sequence[Union[str, int]]) -> None:
        """Spoil the next ``len(faults)`` GET requests, one fault each, in order: ``'cut'`` sends the headers
        and half of the body, then closes the connection; an int answers with that HTTP status."""
        for fault in faults:
            if fault != 'cut' and not (isinstance(fault, int) and 400 <= fault < 600):
                raise ValueError(f"fault {fault!r}: use 'cut' or an HTTP error status (400-599)")
        with self._lock:
            self._faults.extend(faults)

    def outage(self, seconds: float, fault: Union[str, int] = 503) -> None:
        """Answer every request of the next ``seconds`` with ``fault``: an HTTP error status, or ``'drop'``
        (the connection closes before any answer, as when the server is down)."""
        if fault != 'drop' and not (isinstance(fault, int) and 400 <= fault < 600):
            raise ValueError(f"fault {fault!r}: use 'drop' or an HTTP error status (400-599)")
        with self._lock:
            self._outage_fault, self._outage_until = fault, time.monotonic() + seconds

    def start(self) -> 'LoopbackServer':
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    # Used by the request handler.
    def _record(self, request: Request) -> Optional[Union[str, int]]:
        with self._lock:
            self._log.append(request)
            if time.monotonic() < self._outage_until:
                return self._outage_fault
            if request.method == 'GET' and self._faults:
                return self._faults.pop(0)
        return None

    def _sent(self, n: int) -> None:
        with self._lock:
            self._bytes_sent += n


def _handler_class(server: LoopbackServer):

    class Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'  # keep-alive, as clients pool connections

        def log_message(self, format, *args):  # noqa: A002 (the base class's name); quiet
            pass

        def do_HEAD(self):
            self._serve(body=False)

        def do_GET(self):
            self._serve(body=True)

        def _local_path(self) -> Optional[str]:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            full = osp.realpath(osp.join(server.folder, path.lstrip('/')))
            if full != server.folder and not full.startswith(server.folder + os.sep):
                return None  # outside the served folder
            return full

        def _serve(self, body: bool):
            rng = self.headers.get('Range')
            fault = server._record(Request(self.command, urllib.parse.unquote(self.path), rng))
            if server.delay_s:
                time.sleep(server.delay_s)
            if isinstance(fault, int):
                return self._empty(fault)
            if fault == 'drop':
                self.close_connection = True
                return
            path = self._local_path()
            if path is None or not osp.exists(path):
                return self._empty(404)
            if osp.isdir(path):
                if not self.path.split('?')[0].endswith('/'):
                    self.send_response(301)
                    self.send_header('Location', self.path + '/')
                    self.send_header('Content-Length', '0')
                    self.end_headers()
                    return
                return self._listing(path, body)
            size = osp.getsize(path)
            start, end, status = 0, size, 200
            if rng is not None and server.ranges:
                match = _RANGE.match(rng.strip())
                if match is None or match.groups() == ('', ''):
                    return self._empty(416, size)
                first, last = match.groups()
                if first == '':  # the last n bytes
                    start = max(0, size - int(last))
                else:
                    start = int(first)
                    end = min(size, int(last) + 1) if last else size
                if start >= size or start >= end:
                    return self._empty(416, size)
                status = 206
            stat = os.stat(path)
            self.send_response(status)
            self.send_header('Content-Type', 'application/octet-stream')
            self.send_header('Content-Length', str(end - start))
            if server.ranges:
                self.send_header('Accept-Ranges', 'bytes')
            self.send_header('ETag', f'"{stat.st_ino:x}-{stat.st_size:x}-{stat.st_mtime_ns:x}"')
            self.send_header('Last-Modified', email.utils.formatdate(stat.st_mtime, usegmt=True))
            if status == 206:
                self.send_header('Content-Range', f'bytes {start}-{end - 1}/{size}')
            self.end_headers()
            if not body:
                return
            if fault == 'cut':  # half of the body, then the connection drops
                end = start + (end - start) // 2
                self.close_connection = True
            with open(path, 'rb') as f:
                f.seek(start)
                left = end - start
                while left > 0:
                    data = f.read(min(left, _COPY_BLOCK))
                    if not data:
                        break
                    self.wfile.write(data)
                    server._sent(len(data))
                    left -= len(data)

        def _listing(self, folder: str, body: bool):
            links = []
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                name = entry.name + ('/' if entry.is_dir() else '')
                links.append(f'<a href="{html.escape(urllib.parse.quote(name))}">{html.escape(name)}</a><br>')
            page = ('<html><body>\n' + '\n'.join(links) + '\n</body></html>\n').encode()
            self.send_response(200)
            self.send_header('Content-Type', 'text/html; charset=utf-8')
            self.send_header('Content-Length', str(len(page)))
            self.end_headers()
            if body:
                self.wfile.write(page)
                server._sent(len(page))

        def _empty(self, status: int, size: Optional[int] = None):
            self.send_response(status)
            if status == 416 and size is not None:
                self.send_header('Content-Range', f'bytes */{size}')
            self.send_header('Content-Length', '0')
            self.end_headers()

    return Handler


@contextlib.contextmanager
def serve_folder(folder: str, delay_s: float = 0.0, ranges: bool = True) -> Iterator[LoopbackServer]:
    """Serve ``folder`` at ``server.url`` (``http://127.0.0.1:<free port>``) for the ``with`` block.

    Args:
        folder: the folder whose files and sub-folders are served, read-only.
        delay_s: seconds added to every request before it is answered (a network's latency).
        ranges: answer ``Range`` with ``206``; False: ignore it, ``200`` and the whole file.
    """
    server = LoopbackServer(folder, delay_s, ranges).start()
    try:
        yield server
    finally:
        server.stop()
