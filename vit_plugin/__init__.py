"""vit_plugin: the Vision Transformer paper as an OpenMMLab plugin.

Importing the package (e.g. through ``custom_imports=dict(imports=['vit_plugin'])`` in a config)
registers every component under the ``vit_plugin`` scope. The XLA path (:mod:`vit_plugin.xla`) and the
figures (:mod:`vit_plugin.evaluation.figures`) are imported only when used. The paper's released models
are known by name (:mod:`vit_plugin.zoo`):
``vit_plugin.get_model(name, pretrained=True)``, ``vit_plugin.list_models(pattern)``, and mmpretrain's
own ``get_model`` / ``list_models`` / inferencers.

What importing does (docs/development.md#what-importing-does):

1. checks that the OpenMMLab packages are installed (:func:`vit_plugin.stack.require_openmmlab`);
2. lets ``import mmcv._ext`` find :mod:`vit_plugin.ops` where mmcv has no compiled operators;
3. registers the components into the ``vit_plugin`` registries and mmengine's;
4. registers the safe checkpoint loaders (:func:`vit_plugin.checkpoint.install`);
5. puts the released models into mmpretrain's model index (:mod:`vit_plugin.zoo`).

Nothing else: process effects live in :mod:`vit_plugin.runtime`.
"""
from .version import __version__
from . import stack as _stack

_stack.require_openmmlab()  # one message naming both stacks, before any import of them can fail

from . import ops as _ops  # noqa: E402

_ops.install()  # before the imports below, some of which reach mmcv.ops

from . import registry  # noqa: E402,F401  (creates the scope before anything registers into it)
from .checkpoint import install as _install_safe_checkpoint_loading  # noqa: E402

_install_safe_checkpoint_loading()

from . import converters, datasets, engine, evaluation, models  # noqa: E402,F401
from .zoo import get_model, list_models  # noqa: E402  (the released models, also put into mmpretrain's index)

__all__ = ['__version__', 'get_model', 'list_models']
