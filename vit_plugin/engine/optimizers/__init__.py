from .amp import CPUAmpOptimWrapper, Fp32Policy, use_mixed_precision
from .layer_decay import LayerDecayOptimWrapperConstructor, find_layer_depth_module

__all__ = ['CPUAmpOptimWrapper', 'Fp32Policy', 'LayerDecayOptimWrapperConstructor',
           'find_layer_depth_module', 'use_mixed_precision']
