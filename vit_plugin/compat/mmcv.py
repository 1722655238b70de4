"""mmcv's private names (``mmcv._ext``, an ``ext_loader`` convention); checked: mmcv-lite 2.1.0, onedl-mmcv 2.3.6."""
import importlib
from types import ModuleType

__all__ = ['EXT_MODULE', 'import_ext']

EXT_MODULE = 'mmcv._ext'


def import_ext() -> ModuleType:
    """``mmcv._ext``: the compiled extension, else vit_plugin's operators; ImportError if neither."""
    return importlib.import_module(EXT_MODULE)


INHERITED: dict = {}
