from .safe_load import (SAFE_GLOBALS, TRUST_ENV, CheckpointError, UnsafeCheckpointError, install,
                        load_local_checkpoint, register_checkpoint_format, safe_torch_load)

__all__ = ['SAFE_GLOBALS', 'TRUST_ENV', 'CheckpointError', 'UnsafeCheckpointError', 'install',
           'load_local_checkpoint', 'register_checkpoint_format', 'safe_torch_load']
