"""The one home of vit_plugin's process-level effects: each installed when what needs it starts, and
undone when it ends, where undoing has a meaning.

Nothing here happens at import (``import vit_plugin`` only registers: see its docstring and
docs/development.md#what-importing-does). The effects and their owners:

=========================  ===============================================  ================================
Effect                     Installed                                        Undone
=========================  ===============================================  ================================
Signal handlers            :class:`SignalHandlers`: ``PreemptionHook``'s    ``restore()``: the run's end
                           SIGTERM/SIGUSR1 handlers, at ``before_run``      (``after_run``, or the runner
                                                                            when the run fails)
Data-loader worker shield  :class:`WorkerShield`: from ``PreemptionHook``'s ``release()``, with the handlers;
                           construction (iteration loops fork their         the at-fork hook goes with the
                           workers before ``before_run``)                   last shield
At-fork hooks              :func:`install_fork_hook`: the worker shield;    :func:`remove_fork_hook`; the
                           :func:`file_system` (this process's fsspec file  file systems' hook stays while
                           systems), when the first remote shard is opened  the process holds them
``gc.freeze``              :func:`frozen_heap`, around the tar index's      the end of the build
                           parallel build
Helper process signals     :func:`default_stop_signals`, initializer of     the helper's exit
                           the index build's forked workers
torch's worker signal      ``compat.torch.wrap_worker_signal_handlers``,    the worker's exit
set-up                     from the shield's hook, in a forked child only
Process group and its      :func:`join_gloo_group`, when a multi-process    :func:`release_process_group`,
environment variables      run without GPUs starts (the run plan says so;   when the tool's run is over
                           ``vit_plugin.engine.runner.start_process``)
=========================  ===============================================  ================================

stdout and stderr are never replaced.
"""
from .file_systems import file_system
from .forks import fork_hooks, install_fork_hook, remove_fork_hook
from .memory import frozen_heap
from .process_group import join_gloo_group, release_process_group
from .signals import (SignalHandlers, WorkerShield, default_stop_signals, in_main_thread, is_signal_name,
                      shielded_signals, signal_name, signal_number)

__all__ = ['SignalHandlers', 'WorkerShield', 'default_stop_signals', 'file_system', 'fork_hooks', 'frozen_heap', 'in_main_thread',
           'install_fork_hook', 'is_signal_name', 'join_gloo_group', 'release_process_group', 'remove_fork_hook', 'shielded_signals', 'signal_name',
           'signal_number']
