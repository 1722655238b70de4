from .amp import (AutocastOptimWrapper, CPUAmpOptimWrapper, Fp32Policy, check_bf16_device, cuda_bf16_native,
                  resolve_precision, use_mixed_precision)
from .layer_decay import LayerDecayOptimWrapperConstructor, find_layer_depth_module

__all__ = ['AutocastOptimWrapper', 'CPUAmpOptimWrapper', 'Fp32Policy', 'LayerDecayOptimWrapperConstructor',
           'check_bf16_device', 'cuda_bf16_native', 'find_layer_depth_module', 'resolve_precision',
           'use_mixed_precision']
