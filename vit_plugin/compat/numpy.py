"""Private names of numpy that vit_plugin needs; checked against numpy 1.26.4 and 2.2.6."""
from typing import Dict

__all__ = ['pickle_reconstructors']


def pickle_reconstructors() -> Dict[str, object]:
    """The functions rebuilding a pickled ``ndarray`` or scalar, by pickled name, from ``numpy.core.multiarray``
    (1) or ``numpy._core.multiarray`` (2); no public module has them."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1
        from numpy.core import multiarray
    return {'_reconstruct': multiarray._reconstruct, 'scalar': multiarray.scalar}


INHERITED: dict = {}
