"""Lets ``import mmcv._ext`` find vit_plugin's operators when mmcv has no compiled extension.

mmcv's Python wrappers load their kernels with ``importlib.import_module('mmcv._ext')``. With
``mmcv-lite`` (all of mmcv's Python code, none of its compiled code) that import fails, and with it
``import mmcv.ops``, ``mmdet.models`` and every detector. :class:`MmcvExtFinder` answers that one
import with ``vit_plugin/ops/ext.py`` (NMS, RoIAlign and the sigmoid focal loss from torchvision and
torch, and a clear error for every other operator).

The finder sits at the *end* of ``sys.meta_path``: Python's own path finder looks first, so a
compiled ``mmcv/_ext*.so`` is always found and used untouched, and the finder is only asked when
there is none.

Two things install it, so that any import order works:

- ``vit_plugin_mmcv_ext.pth`` in site-packages, at interpreter start-up (``tools/setup_env.sh`` and
  a wheel install put it there; ``python -m vit_plugin.ops install-hook`` does it for any environment).
  This covers scripts that import ``mmcv.ops`` or ``mmdet.models`` before ``vit_plugin``.
- ``import vit_plugin`` (also through ``custom_imports`` in a config), before vit_plugin imports
  anything that reaches ``mmcv.ops``.

This module is a top-level module on purpose and imports only the standard library: the ``.pth``
runs it in every interpreter that starts in the environment, and importing ``vit_plugin`` there would
import torch each time. Set ``VIT_PLUGIN_OPS_HOOK=0`` to keep the start-up hook from installing the
finder (``import vit_plugin`` still installs it).
"""
import importlib.abc
import importlib.util
import os
import sys

NAME = 'mmcv._ext'
PTH_NAME = 'vit_plugin_mmcv_ext.pth'
# The .pth line: tolerant of vit_plugin having been removed without its .pth.
PTH_LINE = ("import importlib.util as u; u.find_spec('_vit_plugin_mmcv_ext') and "
            "__import__('_vit_plugin_mmcv_ext').install(startup=True)\n")


class MissingCompiledOpError(RuntimeError):
    """An mmcv operator that needs mmcv's compiled extension, which this installation lacks. (Defined here,
    in a module imported once, so that ``mmcv._ext`` and ``vit_plugin.ops.ext`` raise the same class.)"""


def provider_path():
    """Path of ``vit_plugin/ops/ext.py`` for the vit_plugin this interpreter imports (or None)."""
    package = sys.modules.get('vit_plugin')  # being imported, or imported
    roots = list(getattr(package, '__path__', None) or [])
    if not roots:
        spec = importlib.util.find_spec('vit_plugin')  # finds, does not import, a top-level package
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = os.path.join(root, 'ops', 'ext.py')
        if os.path.isfile(path):
            return path
    return None


class MmcvExtFinder(importlib.abc.MetaPathFinder):
    """Finds ``mmcv._ext`` as vit_plugin's ``ops/ext.py`` when no earlier finder found a compiled one."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME:
            return None
        source = provider_path()
        if source is None:
            return None
        return importlib.util.spec_from_file_location(NAME, source)


def installed():
    """Whether a finder of this kind is in ``sys.meta_path``."""
    return any(type(f).__name__ == MmcvExtFinder.__name__ and type(f).__module__ == __name__
               for f in sys.meta_path)


def install(startup=False):
    """Appends the finder to ``sys.meta_path`` once (after Python's path finder)."""
    if startup and os.environ.get('VIT_PLUGIN_OPS_HOOK', '1') == '0':
        return
    if not installed():
        sys.meta_path.append(MmcvExtFinder())


def write_startup_file(site_dir):
    """Writes ``vit_plugin_mmcv_ext.pth`` into ``site_dir`` (a site-packages folder) unless it is there
    already; returns its path."""
    path = os.path.join(site_dir, PTH_NAME)
    try:
        with open(path) as f:
            if f.read() == PTH_LINE:
                return path
    except OSError:
        pass
    with open(path + '.tmp', 'w') as f:
        f.write(PTH_LINE)
    os.replace(path + '.tmp', path)
    return path
