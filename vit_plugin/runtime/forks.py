"""At-fork hooks installed by name and removable (one ``os.register_at_fork`` callback runs them)."""
import os
from typing import Callable, Dict, List

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
