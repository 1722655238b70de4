from .fit import CheckpointMismatchError, load_checkpoint_strict
from .safe_load import (SAFE_GLOBALS, TRUST_ENV, CheckpointError, UnsafeCheckpointError, install,
                        load_local_checkpoint, register_checkpoint_format, safe_torch_load)

__all__ = ['CheckpointMismatchError', 'load_checkpoint_strict', 'SAFE_GLOBALS', 'TRUST_ENV', 'CheckpointError',
           'UnsafeCheckpointError', 'install', 'load_local_checkpoint', 'register_checkpoint_format', 'safe_torch_load']
