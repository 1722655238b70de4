"""Training on XLA devices (Cloud TPUs; XLA:CPU for tests) inside mmengine's FlexibleRunner.

Not imported by ``import vit_plugin``: mmengine imports it when a config names one of its
components (``vit_plugin.XLAStrategy``, ``vit_plugin.XLAOptimWrapper``, the ``vit_plugin.XLA*``
loops), and ``tools/train.py --launcher xla`` imports it to launch. Importing it needs neither
torch_xla nor an XLA device; both are reached only when training starts (:mod:`.runtime`).
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
