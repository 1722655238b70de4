"""Training and evaluation as ``tools/train.py`` and ``tools/test.py`` run them (not imported by
``import vit_plugin``).

:mod:`.launch` holds one function per concern between reading a config and running the runner (the
command-line options, the launcher and strategy, resumption, the runner); :mod:`.train` and
:mod:`.test` hold each tool's command line (``parse_args``), its ``merge_args`` and its ``main``.
"""
from .launch import (LAUNCHERS, amp_precision, build_runner, disable_pin_memory, disable_tf32,
                     exit_on_expected_errors, is_rank_zero, merge_cfg_options, run_training, set_resume, set_work_dir,
                     setup_launcher, skip_validation, training_device, use_amp, use_auto_scale_lr, use_fsdp)

__all__ = [
    'LAUNCHERS', 'amp_precision', 'build_runner', 'disable_pin_memory', 'disable_tf32', 'exit_on_expected_errors',
    'is_rank_zero', 'merge_cfg_options', 'run_training', 'set_resume', 'set_work_dir', 'setup_launcher',
    'skip_validation', 'training_device', 'use_amp', 'use_auto_scale_lr', 'use_fsdp'
]
