"""Process-level effects in one place: signal handlers of the training process, shields for its data-loader
workers, defaults for forked helpers, at-fork hooks and the collector's frozen heap."""
import collections
import contextlib
import gc
import os
import signal
import threading
import weakref
from typing import Callable, Dict, Iterable, Iterator, List

from vit_plugin.compat import torch as torch_compat

__all__ = ['SignalHandlers', 'WorkerShield', 'default_stop_signals', 'fork_hooks', 'frozen_heap', 'in_main_thread',
           'install_fork_hook', 'is_signal_name', 'remove_fork_hook', 'shielded_signals', 'signal_name',
           'signal_number', 'stops_held']

Handler = Callable[[int, object], None]


# ----------------------------------------------------------------------------------------------- at-fork hooks
_HOOKS: Dict[str, Callable[[], None]] = {}
_REGISTERED = False


def _after_fork_in_child() -> None:
    for hook in list(_HOOKS.values()):
        hook()


def install_fork_hook(name: str, after_in_child: Callable[[], None]) -> None:
    """Run ``after_in_child`` in every child forked from now on, until :func:`remove_fork_hook`; no-op without fork."""
    global _REGISTERED
    if not hasattr(os, 'register_at_fork'):
        return
    if not _REGISTERED:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _REGISTERED = True
    _HOOKS[name] = after_in_child


def remove_fork_hook(name: str) -> None:
    """Stop running the hook ``name`` in children forked from now on (no error if there is none)."""
    _HOOKS.pop(name, None)


def fork_hooks() -> List[str]:
    """The names of the installed hooks, in the order they run."""
    return list(_HOOKS)


# ------------------------------------------------------------------------------------------------- the heap
@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap for the block (forked children share its pages); unfrozen after, unless frozen before."""
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


# ---------------------------------------------------------------------------------------------------- signals
def is_signal_name(name: str) -> bool:
    """Whether ``name`` names a signal of this system (``'SIGTERM'``, ``'SIGUSR1'``...)."""
    return isinstance(getattr(signal, str(name), None), signal.Signals)


def signal_number(name: str) -> int:
    """The number of the signal ``name``; ValueError if this system has none of that name."""
    if not is_signal_name(name):
        raise ValueError(f'{name!r} is not a signal name on this system (e.g. SIGTERM, SIGUSR1, SIGINT)')
    return int(getattr(signal, name))


def signal_name(signum: int) -> str:
    """``'SIGTERM'`` for ``signal.SIGTERM``'s number."""
    return signal.Signals(signum).name


class SignalHandlers:
    """``handler(signum, frame)`` for ``signums`` from :meth:`install` to :meth:`restore` (main thread only).

    Also a context manager.
    """

    def __init__(self, signums: Iterable[int], handler: Handler):
        self.signums = list(signums)
        self.handler = handler
        self._previous = {}

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> 'SignalHandlers':
        for signum in self.signums:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self.handler)
        return self

    def restore(self) -> None:
        """Give the signals back to their previous handlers (a non-Python one becomes the default); idempotent."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def __enter__(self) -> 'SignalHandlers':
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()


# Worker shielding ---------------------------------------------------------------------------------------

#: How many held shields cover each signal.
_SHIELDED: collections.Counter = collections.Counter()
_FORK_HOOK = 'vit_plugin.runtime.process:shield_forked_workers'


def shielded_signals() -> List[int]:
    """The signals that data-loader workers forked now would be shielded from."""
    return sorted(signum for signum, count in _SHIELDED.items() if count > 0)


class WorkerShield:
    """While held, data-loader workers forked from this process are shielded from ``signums``.

    In each child forked meanwhile, shielded signals other than SIGTERM are ignored; in a data-loader
    worker, SIGTERM ends it only when its training process sent it. Held from construction to
    :meth:`release` (or collection). See docs/development.md#what-importing-does.
    """

    def __init__(self, signums: Iterable[int]):
        self.signums = list(signums)
        self._state = {'held': False}
        # a shield nobody releases (its owner dropped without a run) goes with its owner
        weakref.finalize(self, _release, self.signums, self._state)
        self.hold()

    @property
    def held(self) -> bool:
        return self._state['held']

    def hold(self) -> None:
        if self._state['held']:
            return
        self._state['held'] = True
        _SHIELDED.update(self.signums)
        install_fork_hook(_FORK_HOOK, _shield_worker)

    def release(self) -> None:
        _release(self.signums, self._state)


def _release(signums: List[int], state: dict) -> None:
    if not state['held']:
        return
    state['held'] = False
    _SHIELDED.subtract(signums)
    if not shielded_signals():
        _SHIELDED.clear()
        remove_fork_hook(_FORK_HOOK)


def _shield_worker() -> None:
    shielded = set(shielded_signals())
    for signum in shielded - {signal.SIGTERM}:
        signal.signal(signum, signal.SIG_IGN)
    if signal.SIGTERM in shielded and hasattr(signal, 'sigwaitinfo'):
        torch_compat.wrap_worker_signal_handlers(_sigterm_from_parent_only)  # this child's module only


def _sigterm_from_parent_only() -> None:
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit the mask

    def wait():
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == parent:
                os._exit(0)

    threading.Thread(target=wait, name='sigterm-from-parent', daemon=True).start()


_HELPER_STOPS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Hold SIGTERM and SIGINT back from this thread for the block, to fork helpers in it.

    A helper forked in the block starts with both blocked, so that neither reaches a handler it inherited
    (a pre-emption handler only notes a signal) before :func:`default_stop_signals` replaces it and lets
    them in: a SIGTERM sent to a helper still starting ends it once it is ready. This process gets them
    when the block ends, or in another thread meanwhile.
    """
    if not hasattr(signal, 'pthread_sigmask'):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELPER_STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def default_stop_signals() -> None:
    """Initializer of a forked helper process: SIGTERM ends it, Ctrl-C is ignored (the parent stops it);
    then lets in what :func:`stops_held` held back."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, 'pthread_sigmask'):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELPER_STOPS)


def in_main_thread() -> bool:
    """Whether signal handlers can be installed from here (only the main thread can)."""
    return threading.current_thread() is threading.main_thread()
