from .layer_decay import LayerDecayOptimWrapperConstructor, find_layer_depth_module

__all__ = ['LayerDecayOptimWrapperConstructor', 'find_layer_depth_module']
