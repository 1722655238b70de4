"""vit_plugin: the Vision Transformer paper as an OpenMMLab plugin.

Importing the package (e.g. through ``custom_imports=dict(imports=['vit_plugin'])`` in a config)
registers every component under the ``vit_plugin`` scope. The XLA path (:mod:`vit_plugin.xla`) and the
figures (:mod:`vit_plugin.evaluation.figures`) are imported only when used. The paper's released models
are known by name (:mod:`vit_plugin.zoo`):
``vit_plugin.get_model(name, pretrained=True)``, ``vit_plugin.list_models(pattern)``, and mmpretrain's
own ``get_model`` / ``list_models`` / inferencers.

What importing does, each with its reason (docs/development.md#what-importing-does):

1. Checks that the OpenMMLab packages are installed (:func:`vit_plugin.stack.require_openmmlab`): one
   message naming both stacks, before an import of them fails.
2. Lets ``import mmcv._ext`` find the operators of :mod:`vit_plugin.ops` when mmcv has no compiled
   extension (:func:`vit_plugin.ops.install`, a ``sys.meta_path`` finder; a compiled mmcv is used
   untouched). mmdet's and mmcv's modules that our detection components register with import
   ``mmcv.ops``, which imports ``mmcv._ext``: without the finder those names cannot be registered.
3. Registers the components (models, datasets, transforms, hooks, runners, optimizer wrappers,
   metrics) into the ``vit_plugin`` registries and mmengine's.
4. Registers the safe checkpoint loaders with mmengine's ``CheckpointLoader.register_scheme``
   (:func:`vit_plugin.checkpoint.install`) for local paths, ``http(s)://`` and ``hf-hub:``. The
   released models' weights are ``hf-hub:`` names, which must resolve wherever mmengine loads a
   checkpoint (``load_from``, ``init_cfg``, mmpretrain's ``get_model``); local and http(s) checkpoints
   load as tensors only, so a third-party checkpoint never executes code in the process.
5. Puts the released models into mmpretrain's model index (:mod:`vit_plugin.zoo`), so that
   ``mmpretrain.get_model(name)`` and its inferencers resolve the names. mmpretrain's public
   ``ModelHub.register_model_index`` reads a model-index.yml whose entries name config *files*; our
   configs are built in code (from an installed wheel, without ``configs/``, and
   :func:`vit_plugin.zoo.register_model` adds models at run time), so the entries go in one by one
   through :func:`vit_plugin.compat.mmpretrain.add_to_model_index`, as that function does per entry.

Nothing else: no signal handlers, no at-fork hooks, no ``gc`` changes, no replacement of stdout or
stderr, no environment variables. Those effects belong to the run that needs them
(:mod:`vit_plugin.runtime`).
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
