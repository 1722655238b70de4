"""``tools/train.py`` run in the test process: what a run does and says, without importing the whole stack
again in a subprocess."""
import contextlib
import gc
import io
from typing import NamedTuple, Optional, Union

from vit_plugin.cli.train import main as train_main


class Outcome(NamedTuple):
    """How a run in the test process ended: ``code`` (the exit status, or its message, as ``sys.exit`` takes
    it; 0 when it returned), the ``SystemExit`` it raised (None when it returned) and what it printed."""
    code: Union[int, str]
    stop: Optional[SystemExit]
    output: str


def helper_modules(names, in_process: bool) -> list:
    """A config's ``custom_imports`` of vit_plugin and the helper modules ``names`` (``'loss_recorder'``): by
    file name for a training subprocess (tests/helpers is on its path), as ``helpers.<name>`` for a run in
    the test process, where the tests import them under that name (one registration of each hook)."""
    return ['vit_plugin'] + [f'helpers.{name}' if in_process else name for name in names]


def train_in_process(cfg, work_dir, *extra) -> Outcome:
    """``tools/train.py cfg --work-dir work_dir *extra`` in this process (single process, launcher none).

    The output is what the run's logger and ``warnings`` print: the runner's logger is made during the run,
    on the redirected streams. Each run needs a config file of its own name, so that its logger (named
    after the config and the second the run started) is a new one."""
    out = io.StringIO()
    stop = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            train_main([str(cfg), '--work-dir', str(work_dir), *extra])
        except SystemExit as exit_:
            stop = exit_
    _release(stop)
    return Outcome(0 if stop is None else (stop.code or 0), stop, out.getvalue())


def _release(stop: Optional[BaseException]) -> None:
    """Let the run's runner go, as a subprocess's would with its process: no traceback of the stop keeps
    its frames, and a collection ends its data loaders' (persistent) workers now, not whenever a later
    test's allocations trigger one. Left alive, they are children of the test process that a later test
    may count or end, and their end then reaches torch's SIGCHLD handler in the middle of that test."""
    error = stop
    while error is not None:
        error.__traceback__ = None
        error = error.__context__ or error.__cause__
    gc.collect()
