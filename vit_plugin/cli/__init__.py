"""The command-line mains behind ``tools/``, one module per command (not imported by ``import vit_plugin``).

:mod:`.launch` holds one function per step between reading a config and running the runner;
:mod:`.common` the parser and error handling the commands share. The Python API is :mod:`vit_plugin.apis`.
"""
from .launch import (LAUNCHERS, amp_precision, build_runner, disable_pin_memory, disable_tf32,
                     exit_on_expected_errors, is_rank_zero, merge_cfg_options, run_training, set_resume, set_work_dir,
                     setup_launcher, skip_validation, training_device, use_amp, use_auto_scale_lr, use_fsdp)

__all__ = [
    'LAUNCHERS', 'amp_precision', 'build_runner', 'disable_pin_memory', 'disable_tf32', 'exit_on_expected_errors',
    'is_rank_zero', 'merge_cfg_options', 'run_training', 'set_resume', 'set_work_dir', 'setup_launcher',
    'skip_validation', 'training_device', 'use_amp', 'use_auto_scale_lr', 'use_fsdp'
]
