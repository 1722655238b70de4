"""The child processes the benchmarks measure in (one fresh interpreter per measurement): the folders
they import from, the checkout whose ``configs/`` they read, and the message when one fails."""
import importlib.util
import os
import os.path as osp
import sys
from typing import Dict

#: The folder holding this ``benchmarks`` package (``tools/analysis``, which a script there has first on
#: ``sys.path``).
BENCHMARKS_PARENT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: The checkout these tools belong to: its ``configs/`` and ``tests/`` are what the benchmarks read.
CHECKOUT = osp.dirname(osp.dirname(BENCHMARKS_PARENT))
#: The folder holding the ``vit_plugin`` package this process imports (installed, editable or not).
PACKAGE_PARENT = osp.dirname(osp.dirname(importlib.util.find_spec('vit_plugin').origin))


def child_env(**extra: str) -> Dict[str, str]:
    """This process's environment plus ``extra``, with ``PYTHONPATH`` led by :data:`PACKAGE_PARENT` and
    :data:`BENCHMARKS_PARENT`: a child started with ``-m benchmarks.<module>`` imports this very
    ``vit_plugin`` and these benchmarks."""
    path = [PACKAGE_PARENT, BENCHMARKS_PARENT, os.environ.get('PYTHONPATH', '')]
    return dict(os.environ, **extra, PYTHONPATH=os.pathsep.join(filter(None, path)))


def child_failure(what: str, error_output: str) -> str:
    """A one-line message for a failed child process. Its error output (a traceback, say) is written to
    this process's stderr first, so the message keeps only the last line."""
    sys.stderr.write(error_output)
    last = (error_output.strip().splitlines() or ['no error output'])[-1]
    return f'{what} failed: {last}'
