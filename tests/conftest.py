"""Shared test set-up.

torch_xla must initialise its runtime before the first CPU backward pass of the process
(pytorch/xla#4174), so when it is installed we initialise it here, before any test runs, on its CPU
backend. Tests that train through XLA then share this process safely.

The fixtures several test files share, built once per pytest run, live here; the hooks at the end put
the longest test files first (or, with ``--shuffle``, the files in a random order whose seed the header
prints), leave the ``stack_independent`` files to the current stack (tests/README.md), and record the
files' durations (helpers/durations.py).
"""
import gc
import multiprocessing
import os
import os.path as osp
import random
import signal
import time
from collections import defaultdict

os.environ.setdefault('PJRT_DEVICE', 'CPU')

try:
    import torch_xla  # noqa: E402

    torch_xla.device()  # initialise the PJRT runtime now
except ImportError:  # torch_xla is optional for users; the set-up installs it for the tests
    pass

import torch  # noqa: E402

# Two threads at most; fewer when pytest-xdist workers share the cores (`make test` starts one per core).
_workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _workers)))

import pytest  # noqa: E402

from helpers import durations  # noqa: E402
from helpers.stack import STACK, XLA_SKIP_REASON  # noqa: E402

if STACK not in ('current', 'classic'):
    raise pytest.UsageError(f'the environment holds {STACK or "neither"} of the two stacks\' OpenMMLab packages; '
                            'set it up with `make setup` or `STACK=classic make setup`')


@pytest.fixture(scope='session')
def digits_root(tmp_path_factory):
    """The demo's digits dataset (1,797 32x32 PNGs), prepared once per pytest run."""
    from vit_plugin.datasets.digits import prepare_digits_dataset
    return prepare_digits_dataset(str(tmp_path_factory.mktemp('data') / 'digits'))


@pytest.fixture(scope='session')
def corpus(tmp_path_factory):
    """The broken and unusual image files of ``helpers/bad_images.py``, written once per pytest run."""
    from helpers.bad_images import write_corpus
    return write_corpus(str(tmp_path_factory.mktemp('corpus')))


_STOP_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP]


@pytest.fixture(scope='module', autouse=True)
def leaves_the_process_as_found(request):
    """Every test file leaves its pytest worker as it found it, since that worker runs the next files: no
    ``multiprocessing`` child left alive (a data-loader worker, a pool), whose end would reach torch's
    SIGCHLD handler in the middle of a later test; and the stop signals' handlers as they were (a run that
    keeps its pre-emption handler turns a later test's SIGTERM into a request to stop)."""
    before = {child.pid for child in multiprocessing.active_children()}

    def new_children():
        return [child for child in multiprocessing.active_children() if child.pid not in before]

    handlers = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    yield
    problems = []
    changed = [signal.Signals(signum).name for signum, handler in handlers.items()
               if signal.getsignal(signum) is not handler]
    if changed:
        problems.append(f'changed the handlers of {", ".join(changed)}')
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    left = new_children()
    if left:  # a loader's workers end with the loader, which a collection may be what ends
        gc.collect()
        deadline = time.monotonic() + 5
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = new_children()
    if left:
        problems.append(f'left {len(left)} multiprocessing children alive '
                        f'({", ".join(f"{c.name} pid {c.pid}" for c in left)})')
        for child in left:
            child.kill()
            child.join(5)
    if problems:
        pytest.fail(f'{request.node.nodeid} {" and ".join(problems)}: undo it in the file (close the loader or '
                    'pool, restore the handlers, or end the run that owns them)', pytrace=False)


def pytest_addoption(parser):
    parser.addoption('--shuffle', nargs='?', const='random', default=None, metavar='SEED',
                     help='run the test files in a random order (each file\'s tests stay together, in '
                          'their order); the run prints the seed, and --shuffle=SEED repeats an order')


def _shuffle_seed(config):
    """The seed of the file order, or None: picked once by the controller (or the only process) and
    handed to pytest-xdist's workers, which must all collect the same order."""
    if hasattr(config, 'workerinput'):
        return config.workerinput.get('vit_shuffle_seed')
    value = config.getoption('shuffle')
    if value is None:
        return None
    if value == 'random':
        return random.SystemRandom().randrange(1 << 32)
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(f'--shuffle takes an integer seed, got {value!r}') from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # pytest-xdist: before a worker starts
    node.workerinput['vit_shuffle_seed'] = node.config.stash[_SEED]


def _order_line(config):
    seed = config.stash[_SEED]
    if seed is not None:
        return f'test files in a shuffled order, seed {seed} (--shuffle={seed} repeats it)'


def pytest_report_header(config):
    return _order_line(config)


def pytest_terminal_summary(terminalreporter, config):  # also under -q, which prints no header
    if _order_line(config):
        terminalreporter.write_line(_order_line(config))


def _shuffled(items, seed):
    """``items`` file by file, the files in the order ``seed`` draws, each file's tests in their order."""
    files = defaultdict(list)
    for item in items:
        files[durations.file_of(item.nodeid)].append(item)
    order = sorted(files)
    random.Random(seed).shuffle(order)
    return [item for name in order for item in files[name]]


def pytest_collection_modifyitems(config, items):
    seed = config.stash[_SEED]
    if seed is None:
        seconds = durations.read().get(STACK, {})
        # The longest files first (tests/durations.json, helpers/durations.py); the sort is stable, so a
        # file's tests keep their order, and files of equal or unrecorded time keep the collection order.
        items.sort(key=lambda item: -seconds.get(durations.file_of(item.nodeid), 0))
    else:
        items[:] = _shuffled(items, seed)
    if STACK == 'classic':
        # Files that read only this repository's sources (ast, import graphs) give the same result on
        # both stacks: the current stack runs them (tests/README.md, pytest.ini's stack_independent).
        independent = [item for item in items if item.get_closest_marker('stack_independent')]
        if independent:
            config.hook.pytest_deselected(items=independent)
            items[:] = [item for item in items if not item.get_closest_marker('stack_independent')]
    if STACK == 'current':
        for item in items:
            if item.get_closest_marker('xla'):
                item.add_marker(pytest.mark.skip(reason=XLA_SKIP_REASON))


def _records_durations(config) -> bool:
    """Whether this process records the files' durations: a run of the whole suite (no file, folder,
    ``-k``, ``-m``, ``--deselect`` or ``--ignore`` narrows it), and with pytest-xdist only the controller,
    which receives every worker's reports."""
    tests = osp.join(str(config.rootpath), 'tests')
    return (not hasattr(config, 'workerinput')
            and [osp.abspath(arg) for arg in config.args] == [tests]
            and not config.getoption('keyword') and not config.getoption('markexpr')
            and not config.getoption('deselect') and not config.getoption('ignore')
            and not config.getoption('ignore_glob'))


_measured = defaultdict(float)
_recording = False  # whether this process records (set by pytest_configure)
_may_stop_early = False  # -x, --maxfail or --sw: a failure ends the run before the other files ran


_SEED = pytest.StashKey()  # the --shuffle seed of this run, or None


def pytest_configure(config):
    global _recording, _may_stop_early
    config.stash[_SEED] = _shuffle_seed(config)
    _recording = _records_durations(config)
    _may_stop_early = bool(config.getoption('maxfail') or config.getoption('stepwise', False))


def pytest_runtest_logreport(report):
    if _recording:
        _measured[durations.file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(exitstatus):
    # Failed tests still give their files' times; a run stopped early (-x, Ctrl-C, internal error) does not.
    complete = exitstatus == pytest.ExitCode.OK or (exitstatus == pytest.ExitCode.TESTS_FAILED
                                                    and not _may_stop_early)
    if _recording and complete and _measured:
        record = durations.read()
        record[STACK] = durations.merged(record.get(STACK, {}), _measured)
        durations.write(record)
