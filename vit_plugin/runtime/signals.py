"""Signal handlers: the training process's, its data-loader workers', and its forked helpers'.

- :class:`SignalHandlers`: handlers installed for a run and given back to the previous ones when it ends
  (``vit_plugin.PreemptionHook``).
- :class:`WorkerShield`: while held, data-loader workers forked from this process are shielded from the
  job-wide signals a scheduler sends (an at-fork hook, removed when the last shield is released).
- :func:`default_stop_signals`: the initializer of forked helper processes (the tar index's build).
"""
import collections
import os
import signal
import threading
import weakref
from typing import Callable, Iterable, List

from vit_plugin.compat import torch as torch_compat

from .forks import install_fork_hook, remove_fork_hook

__all__ = ['SignalHandlers', 'WorkerShield', 'default_stop_signals', 'in_main_thread', 'is_signal_name',
           'shielded_signals', 'signal_name', 'signal_number']

Handler = Callable[[int, object], None]


def is_signal_name(name: str) -> bool:
    """Whether ``name`` names a signal of this system (``'SIGTERM'``, ``'SIGUSR1'``...)."""
    return isinstance(getattr(signal, str(name), None), signal.Signals)


def signal_number(name: str) -> int:
    """The number of the signal ``name`` (see :func:`is_signal_name`)."""
    if not is_signal_name(name):
        raise ValueError(f'{name!r} is not a signal name on this system (e.g. SIGTERM, SIGUSR1, SIGINT)')
    return int(getattr(signal, name))


def signal_name(signum: int) -> str:
    """``'SIGTERM'`` for ``signal.SIGTERM``'s number."""
    return signal.Signals(signum).name


class SignalHandlers:
    """One handler for a set of signals, from :meth:`install` to :meth:`restore`.

    Also a context manager. Only the main thread can install signal handlers (Python's rule).

    Args:
        signums: The signal numbers.
        handler: Called as ``handler(signum, frame)``.
    """

    def __init__(self, signums: Iterable[int], handler: Handler):
        self.signums = list(signums)
        self.handler = handler
        self._previous = {}

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> 'SignalHandlers':
        """Installs the handler, keeping the previous ones (idempotent)."""
        for signum in self.signums:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self.handler)
        return self

    def restore(self) -> None:
        """Gives the signals back to the handlers they had before :meth:`install` (idempotent).

        A previous handler that was not installed from Python (``signal.getsignal`` gives None) becomes
        the default one.
        """
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
_FORK_HOOK = 'vit_plugin.runtime.signals:shield_forked_workers'


def shielded_signals() -> List[int]:
    """The signals that data-loader workers forked now would be shielded from."""
    return sorted(signum for signum, count in _SHIELDED.items() if count > 0)


class WorkerShield:
    """While held, data-loader workers forked from this process are shielded from ``signums``.

    A scheduler signals every process of the job: SLURM sends SIGTERM to all processes of the job step
    (pre-emption, ``scancel``, the end of the time limit), ``scancel --signal=USR1`` sends SIGUSR1, a
    shell's ``kill -- -PGID`` the whole process group. A data-loader worker that dies of it makes the
    training process fail on its next batch, before it could write its checkpoint.

    In each child forked while a shield is held, any shielded signal other than SIGTERM (SIGUSR1,
    whose default action ends a process) is ignored from the fork on. SIGTERM is handled in data-loader
    workers only (other children, a ``multiprocessing`` pool say, keep theirs), right after torch's
    worker loop has installed its own handlers: the worker blocks it and a thread waits for it, exiting
    when the training process sent it (as torch's handler does: the parent ends its workers with SIGTERM
    when it shuts them down or exits) and ignoring it from anyone else.

    Held from construction to :meth:`release` (idempotent), or until the shield is garbage-collected;
    :meth:`hold` takes it again. The at-fork hook is installed with the first held shield and removed
    with the last.
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
    """In a freshly forked child: what :class:`WorkerShield` promises."""
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


def default_stop_signals() -> None:
    """In a forked helper process (a ``multiprocessing`` pool's initializer): SIGTERM ends it, Ctrl-C
    does not.

    A forked child inherits its parent's Python signal handlers: a training process's pre-emption handler
    (which only records SIGTERM) would make the pool's ``terminate`` wait for it forever. Ctrl-C reaches
    the whole process group: the parent stops the pool.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def in_main_thread() -> bool:
    """Whether signal handlers can be installed from here (only the main thread can)."""
    return threading.current_thread() is threading.main_thread()
