"""The child processes the benchmarks measure in (one fresh interpreter per measurement): the folder
they import this package from, the checkout whose ``configs/`` they read, and the message when one fails."""
import os
import os.path as osp
import sys

#: The folder holding the ``vit_plugin`` package: a child process with it on ``PYTHONPATH`` imports this
#: very package, installed or not.
PACKAGE_PARENT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def checkout_root() -> str:
    """The checkout whose ``configs/`` and ``tests/`` the benchmarks read: the one this package lives in
    (an editable install), else the working directory (vit_plugin installed from a wheel, the command
    started in the checkout, as ``make gpu-report`` does)."""
    return PACKAGE_PARENT if osp.isdir(osp.join(PACKAGE_PARENT, 'configs')) else os.getcwd()


def child_failure(what: str, error_output: str) -> str:
    """A one-line message for a failed child process. Its error output (a traceback, say) is written to
    this process's stderr first, so the message keeps only the last line."""
    sys.stderr.write(error_output)
    last = (error_output.strip().splitlines() or ['no error output'])[-1]
    return f'{what} failed: {last}'
