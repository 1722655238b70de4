"""Registries of the ``vit_plugin`` scope, children of mmengine's root; configs name ``vit_plugin.X``.

See docs/configs.md."""
from mmengine.registry import DATA_SAMPLERS as MMENGINE_DATA_SAMPLERS
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import FUNCTIONS as MMENGINE_FUNCTIONS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import LOOPS as MMENGINE_LOOPS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import RUNNERS as MMENGINE_RUNNERS
from mmengine.registry import STRATEGIES as MMENGINE_STRATEGIES
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

SCOPE = 'vit_plugin'


def _child(name, parent, locations):
    return Registry(name, parent=parent, scope=SCOPE, locations=[f'{SCOPE}.{loc}' for loc in locations])


# ``locations``: the modules that register into each registry. mmengine imports them on the first
# lookup; that is how the XLA components (``vit_plugin.xla``, which ``import vit_plugin`` leaves out)
# are found when a config names them. The kinds of component the package has none of (optimizers,
# schedulers, ...) have no registry here: their names resolve in mmengine's.
MODELS = _child('model', MMENGINE_MODELS, ['models'])
DATASETS = _child('dataset', MMENGINE_DATASETS, ['datasets'])
TRANSFORMS = _child('transform', MMENGINE_TRANSFORMS, ['datasets.transforms'])
DATA_SAMPLERS = _child('data sampler', MMENGINE_DATA_SAMPLERS, ['datasets.samplers'])
# The XLA hooks register when the XLA launcher imports vit_plugin.xla; naming it here would import the XLA
# path into every run that builds a hook.
HOOKS = _child('hook', MMENGINE_HOOKS, ['engine'])
LOOPS = _child('loop', MMENGINE_LOOPS, ['engine.loops', 'evaluation', 'xla'])
STRATEGIES = _child('strategy', MMENGINE_STRATEGIES, ['engine.fsdp2', 'xla'])
OPTIM_WRAPPERS = _child('optim_wrapper', MMENGINE_OPTIM_WRAPPERS, ['engine.optimizers', 'xla'])
OPTIM_WRAPPER_CONSTRUCTORS = _child('optimizer wrapper constructor',
                                    MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS, ['engine.optimizers'])
METRICS = _child('metric', MMENGINE_METRICS, ['evaluation'])
FUNCTIONS = _child('function', MMENGINE_FUNCTIONS, ['engine.fsdp2'])
# `runner_type='vit_plugin.Runner'`: what mmengine's, mmpretrain's and mmdet's tools/train.py build.
RUNNERS = _child('runner', MMENGINE_RUNNERS, ['engine.runner'])
