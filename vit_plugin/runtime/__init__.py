"""The one home of vit_plugin's process-level effects, each installed when what needs it starts and undone
when it ends; nothing happens at import. See docs/development.md#what-importing-does.
"""
from .file_systems import file_system
from .process import (SignalHandlers, WorkerShield, default_stop_signals, fork_hooks, frozen_heap, in_main_thread,
                      install_fork_hook, is_signal_name, remove_fork_hook, shielded_signals, signal_name,
                      signal_number, stops_held)
from .process_group import join_gloo_group, release_process_group

__all__ = ['SignalHandlers', 'WorkerShield', 'default_stop_signals', 'file_system', 'fork_hooks', 'frozen_heap',
           'in_main_thread', 'install_fork_hook', 'is_signal_name', 'join_gloo_group', 'release_process_group',
           'remove_fork_hook', 'shielded_signals', 'signal_name', 'signal_number', 'stops_held']
