"""At-fork hooks, installed by name when what needs them starts.

``os.register_at_fork`` cannot be undone, so this module registers one callback of its own, the first
time a hook is installed, and that callback runs the hooks installed at the moment of the fork.
:func:`remove_fork_hook` takes a hook out again, which is how a hook ends with what needed it.
"""
import os
from typing import Callable, Dict, List

_HOOKS: Dict[str, Callable[[], None]] = {}
_REGISTERED = False


def _after_fork_in_child() -> None:
    for hook in list(_HOOKS.values()):
        hook()


def install_fork_hook(name: str, after_in_child: Callable[[], None]) -> None:
    """Run ``after_in_child`` in every child forked from now on, until :func:`remove_fork_hook` (``name``).

    Installing the same name again replaces its hook; hooks run in the order of their first installation.
    Without ``os.register_at_fork`` (Windows: no fork) nothing is installed.
    """
    global _REGISTERED
    if not hasattr(os, 'register_at_fork'):
        return
    if not _REGISTERED:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _REGISTERED = True
    _HOOKS[name] = after_in_child


def remove_fork_hook(name: str) -> None:
    """Children forked from now on no longer run the hook installed as ``name`` (no error if there is none)."""
    _HOOKS.pop(name, None)


def fork_hooks() -> List[str]:
    """The names of the installed hooks, in the order they run."""
    return list(_HOOKS)
