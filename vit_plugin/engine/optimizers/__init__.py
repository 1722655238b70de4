from .amp import (AutocastOptimWrapper, CPUAmpOptimWrapper, Fp32Policy, check_bf16_device, cuda_bf16_native,
                  resolve_precision, use_mixed_precision)
from .grad_norm import global_grad_norm
from .layer_decay import LayerDecayOptimWrapperConstructor, find_layer_depth_module

__all__ = ['AutocastOptimWrapper', 'CPUAmpOptimWrapper', 'Fp32Policy', 'LayerDecayOptimWrapperConstructor',
           'check_bf16_device', 'cuda_bf16_native', 'find_layer_depth_module', 'global_grad_norm',
           'resolve_precision', 'use_mixed_precision']
