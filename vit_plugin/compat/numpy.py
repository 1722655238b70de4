"""Private names of numpy that vit_plugin needs.

Checked against numpy 1.26.4 and 2.2.6.
"""
from typing import Dict

__all__ = ['pickle_reconstructors']


def pickle_reconstructors() -> Dict[str, object]:
    """The two functions a pickled ``ndarray`` or numpy scalar is rebuilt with, by name
    (``_reconstruct``, ``scalar``): the safe checkpoint loader allows exactly these.

    Pickles name them by module path, ``numpy.core.multiarray`` (numpy 1) or ``numpy._core.multiarray``
    (numpy 2, which moved ``numpy.core`` and warns on the old name); numpy has no public module
    holding them.
    """
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1
        from numpy.core import multiarray
    return {'_reconstruct': multiarray._reconstruct, 'scalar': multiarray.scalar}


INHERITED: dict = {}
