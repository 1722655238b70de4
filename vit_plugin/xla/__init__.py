"""Training on XLA devices inside mmengine's FlexibleRunner; importing needs neither torch_xla nor a device.

See docs/scaling.md#tpus-with-torch_xla.
"""
from .hooks import XLARecompileGuardHook, XLARuntimeInfoHook
from .launch import launch_training, to_xla_config
from .loops import (DeviceLoader, XLAEpochBasedTrainLoop, XLAIterBasedTrainLoop, XLATestLoop,
                    XLAValLoop)
from .optim_wrapper import XLAOptimWrapper
from .strategy import XLAStrategy, xla_optim_wrapper_cfg

__all__ = [
    'DeviceLoader', 'XLAEpochBasedTrainLoop', 'XLAIterBasedTrainLoop', 'XLAOptimWrapper',
    'XLARecompileGuardHook', 'XLARuntimeInfoHook', 'XLAStrategy', 'XLATestLoop', 'XLAValLoop',
    'launch_training', 'to_xla_config', 'xla_optim_wrapper_cfg'
]
