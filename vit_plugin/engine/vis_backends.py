"""The visualization backends ``visualizer.vis_backends`` names and the package each needs, checked
before anything is built. See docs/monitoring.md.
"""
import importlib.util
from typing import Iterable, List, Optional, Tuple

from .config_edits import type_name

#: ``--vis`` names and mmengine's backend types.
VIS_BACKENDS = {'tensorboard': 'TensorboardVisBackend', 'wandb': 'WandbVisBackend', 'mlflow': 'MLflowVisBackend'}

#: mmengine's backend types that import a package: (module, how to install it).
BACKEND_PACKAGES = {
    'TensorboardVisBackend': ('tensorboard', 'make setup, or pip install tensorboard'),
    'WandbVisBackend': ('wandb', 'pip install wandb'),
    'MLflowVisBackend': ('mlflow', 'pip install mlflow-skinny'),
    'ClearMLVisBackend': ('clearml', 'pip install clearml'),
    'NeptuneVisBackend': ('neptune', 'pip install neptune'),
    'DVCLiveVisBackend': ('dvclive', 'pip install dvclive'),
    'AimVisBackend': ('aim', 'pip install aim'),
}


def backend_types(visualizer) -> List[str]:
    """The class names of the backends ``visualizer`` (a config dict, or None) names."""
    found = []
    for backend in (visualizer or {}).get('vis_backends') or []:
        kind = backend.get('type') if isinstance(backend, dict) else backend
        found.append(type_name(backend) if isinstance(kind, str) else getattr(kind, '__name__', str(kind)))
    return found


def add_vis_backends(visualizer, names: Iterable[str]) -> dict:
    """``visualizer`` with the backends of ``names`` added after its own (a ``LocalVisBackend`` first); none twice."""
    out = dict(visualizer or dict(type='Visualizer'))
    backends = list(out.get('vis_backends') or [dict(type='LocalVisBackend')])
    for name in names:
        if VIS_BACKENDS[name] not in backend_types(dict(vis_backends=backends)):
            backends.append(dict(type=VIS_BACKENDS[name]))
    out['vis_backends'] = backends
    return out


def missing_vis_packages(visualizer) -> List[Tuple[str, str, str]]:
    """``(backend type, module, install command)`` of each backend whose package is not installed (not imported)."""
    missing = []
    for kind in backend_types(visualizer):
        module, install = BACKEND_PACKAGES.get(kind, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            missing.append((kind, module, install))
    return missing


def check_vis_backends(visualizer: Optional[dict]) -> None:
    """Raise ``ValueError`` naming the package and its install command when a backend of ``visualizer``
    cannot be imported."""
    missing = missing_vis_packages(visualizer)
    if missing:
        kinds = ', '.join(kind for kind, _, _ in missing)
        packages = ', '.join(repr(module) for _, module, _ in missing)
        installs = '; '.join(install for _, _, install in missing)
        raise ValueError(f'visualizer.vis_backends: {kinds} needs {packages}, which is not installed.\n'
                         f'Install it ({installs}), or drop the backend from the config / --vis.')


__all__ = ['BACKEND_PACKAGES', 'VIS_BACKENDS', 'add_vis_backends', 'backend_types', 'check_vis_backends',
           'missing_vis_packages']
