"""mmcv's compiled-operator module ``mmcv._ext`` (an ``ext_loader`` convention, not public).

Checked against mmcv-lite 2.1.0 and onedl-mmcv 2.3.6.
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
