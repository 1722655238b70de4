from .amp import CPUAmpOptimWrapper, Fp32Policy, use_mixed_precision
from .grad_norm import global_grad_norm
from .layer_decay import LayerDecayOptimWrapperConstructor, find_layer_depth_module

__all__ = ['CPUAmpOptimWrapper', 'Fp32Policy', 'LayerDecayOptimWrapperConstructor',
           'find_layer_depth_module', 'global_grad_norm', 'use_mixed_precision']
