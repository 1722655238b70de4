from .strict_load import CheckpointMismatchError, load_checkpoint_strict
from .formats import META_KEY, CheckpointFormatError, read_safetensors, sniff_checkpoint, write_safetensors
from .hub import HUB_PREFIX, HubCheckpointError, resolve_hub_checkpoint
from .safe_load import (SAFE_GLOBALS, TRUST_ENV, CheckpointError, CheckpointFileError, UnsafeCheckpointError, install,
                        is_checkpoint_path, load_local_checkpoint, read_checkpoint_file, register_checkpoint_format,
                        register_state_dict_adapter, safe_torch_load)

__all__ = ['CheckpointMismatchError', 'load_checkpoint_strict', 'SAFE_GLOBALS', 'TRUST_ENV', 'CheckpointError',
           'CheckpointFileError', 'CheckpointFormatError', 'HUB_PREFIX', 'HubCheckpointError', 'META_KEY',
           'UnsafeCheckpointError', 'install', 'is_checkpoint_path', 'load_local_checkpoint', 'read_checkpoint_file',
           'read_safetensors', 'register_checkpoint_format', 'register_state_dict_adapter', 'resolve_hub_checkpoint',
           'safe_torch_load', 'sniff_checkpoint', 'write_safetensors']
