"""The Python API, as ``mmpretrain.apis``: the released models by name and the checked inferencers, which
live in :mod:`vit_plugin.zoo` and :mod:`vit_plugin.inference` (docs/model_zoo.md, docs/inference.md)."""
from vit_plugin.inference import CheckedImageClassificationInferencer, build_classification_inferencer
from vit_plugin.zoo import (ReleasedModel, UnknownModelError, find_model, get_config, get_model, list_models,
                            register_model)

__all__ = [
    'get_model', 'list_models', 'get_config', 'find_model', 'register_model', 'ReleasedModel', 'UnknownModelError',
    'CheckedImageClassificationInferencer', 'build_classification_inferencer'
]

try:  # defined where mmdet (the [det] extra) is installed
    from vit_plugin.inference import CheckedDetInferencer  # noqa: F401
except ImportError:
    pass
else:
    __all__.append('CheckedDetInferencer')
