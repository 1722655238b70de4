from .amp import (AutocastOptimWrapper, CPUAmpOptimWrapper, Fp32Policy, GuardedAutocastOptimWrapper,
                  GuardedCPUAmpOptimWrapper, check_bf16_device, cuda_bf16_native, resolve_precision,
                  use_mixed_precision)
from .grad_norm import global_grad_norm
from .layer_decay import LayerDecayOptimWrapperConstructor, find_layer_depth_module
from .nonfinite_step import (DeviceCountedNonFiniteGuard, GuardedAmpOptimWrapper, GuardedOptimWrapper,
                             NonFiniteGuardMixin, guarded_optim_wrapper_cfg)

__all__ = ['AutocastOptimWrapper', 'CPUAmpOptimWrapper', 'DeviceCountedNonFiniteGuard', 'Fp32Policy',
           'GuardedAmpOptimWrapper', 'GuardedAutocastOptimWrapper', 'GuardedCPUAmpOptimWrapper', 'GuardedOptimWrapper',
           'LayerDecayOptimWrapperConstructor', 'NonFiniteGuardMixin', 'check_bf16_device',
           'cuda_bf16_native', 'find_layer_depth_module', 'global_grad_norm', 'guarded_optim_wrapper_cfg',
           'resolve_precision', 'use_mixed_precision']
