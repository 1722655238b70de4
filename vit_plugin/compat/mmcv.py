"""mmcv's compiled-operator module, by name.

mmcv's Python operators load their kernels with ``importlib.import_module('mmcv._ext')``; vit_plugin
serves that module itself where mmcv has no compiled one (``_vit_plugin_mmcv_ext``) and reads it to
describe and count the operators. The name is a convention of mmcv's ``ext_loader``, not a public
module. Checked against mmcv-lite 2.1.0 and onedl-mmcv 2.3.6.
"""
import importlib
from types import ModuleType

__all__ = ['EXT_MODULE', 'import_ext']

EXT_MODULE = 'mmcv._ext'


def import_ext() -> ModuleType:
    """``mmcv._ext``: the compiled extension, or vit_plugin's operators where there is none.

    Raises:
        ImportError: Neither is available.
    """
    return importlib.import_module(EXT_MODULE)


INHERITED: dict = {}
