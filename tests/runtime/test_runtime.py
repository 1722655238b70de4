"""vit_plugin.runtime, the home of process-level effects: each effect holds from when it is installed to
when it is undone (at-fork hooks, the worker shield, signal handlers, the frozen heap)."""
import gc
import multiprocessing
import os
import signal
import time

import pytest

from vit_plugin import runtime

SHIELD_HOOK = 'vit_plugin.runtime.process:shield_forked_workers'


def in_forked_child(report):
    """What ``report()`` returns in a child forked now (a string)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's clean-up
        try:
            os.write(write, str(report()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def test_a_fork_hook_runs_in_children_forked_until_it_is_removed():
    ran = []
    runtime.install_fork_hook('test-hook', lambda: ran.append('child'))
    try:
        assert 'test-hook' in runtime.fork_hooks()
        assert in_forked_child(lambda: ran) == "['child']"
    finally:
        runtime.remove_fork_hook('test-hook')
    assert 'test-hook' not in runtime.fork_hooks()
    assert in_forked_child(lambda: ran) == '[]' and ran == []


def test_the_worker_shield_holds_from_construction_to_the_last_release():
    # signals no PreemptionHook shields (another test's live hook may hold SIGTERM / SIGUSR1)
    usr2, alarm = signal.SIGUSR2, signal.SIGALRM
    base = set(runtime.shielded_signals())
    assert not base & {usr2, alarm}
    first, second = runtime.WorkerShield([usr2]), runtime.WorkerShield([usr2, alarm])
    try:
        assert set(runtime.shielded_signals()) == base | {usr2, alarm}
        assert in_forked_child(lambda: signal.getsignal(usr2) == signal.SIG_IGN) == 'True'
        second.release()
        second.release()  # idempotent: the first shield still holds SIGUSR2
        assert set(runtime.shielded_signals()) == base | {usr2}
        assert SHIELD_HOOK in runtime.fork_hooks()
        assert in_forked_child(lambda: (signal.getsignal(usr2), signal.getsignal(alarm))) == str(
            (signal.SIG_IGN, signal.getsignal(alarm)))
    finally:
        first.release()
        second.release()
    assert set(runtime.shielded_signals()) == base
    assert (SHIELD_HOOK in runtime.fork_hooks()) == bool(base)  # the hook goes with the last shield
    parent = str(signal.getsignal(usr2))
    assert in_forked_child(lambda: signal.getsignal(usr2)) == parent  # the child keeps the parent's handler


def test_a_shield_nobody_released_goes_with_its_owner():
    shield = runtime.WorkerShield([signal.SIGALRM])
    assert signal.SIGALRM in runtime.shielded_signals()
    del shield
    gc.collect()
    assert signal.SIGALRM not in runtime.shielded_signals()


def test_signal_handlers_are_given_back_to_the_previous_ones():
    def previous(signum, frame):
        pass

    def handler(signum, frame):
        pass

    before = signal.signal(signal.SIGUSR2, previous)
    try:
        handlers = runtime.SignalHandlers([signal.SIGUSR2], handler).install()
        assert signal.getsignal(signal.SIGUSR2) is handler and handlers.installed
        handlers.install()  # idempotent: the previous handler stays the one to give back
        handlers.restore()
        assert signal.getsignal(signal.SIGUSR2) is previous and not handlers.installed
        with runtime.SignalHandlers([signal.SIGUSR2], handler):
            assert signal.getsignal(signal.SIGUSR2) is handler
        assert signal.getsignal(signal.SIGUSR2) is previous
    finally:
        signal.signal(signal.SIGUSR2, before)


def _helper_that_starts_slowly():
    time.sleep(1.5)  # still starting (a pool worker's bootstrap) when its parent ends it
    runtime.default_stop_signals()
    time.sleep(60)


def test_a_helper_forked_while_stops_are_held_ends_on_a_sigterm_sent_while_it_starts():
    """A helper inherits its parent's Python handlers; one that only notes SIGTERM (as pre-emption's does)
    would take a SIGTERM sent before the helper's initializer and leave it running. Forked under
    ``stops_held``, the helper gets the signal once its initializer has made SIGTERM end it."""
    noted = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: noted.append(signum))
    try:
        with runtime.stops_held():
            helper = multiprocessing.get_context('fork').Process(target=_helper_that_starts_slowly)
            helper.start()
        helper.terminate()
        helper.join(30)
        alive = helper.is_alive()
        if alive:
            helper.kill()
            helper.join()
        assert not alive and helper.exitcode == -signal.SIGTERM, helper.exitcode
        assert noted == []  # the signal was the helper's, not this process's
    finally:
        signal.signal(signal.SIGTERM, before)


def test_signal_names_and_numbers():
    assert runtime.signal_number('SIGTERM') == signal.SIGTERM and runtime.signal_name(signal.SIGTERM) == 'SIGTERM'
    assert runtime.is_signal_name('SIGUSR1') and not runtime.is_signal_name('SIG_IGN')
    with pytest.raises(ValueError, match="'SIGNOPE' is not a signal name"):
        runtime.signal_number('SIGNOPE')


def test_the_heap_is_frozen_for_the_block_only():
    assert gc.get_freeze_count() == 0
    with runtime.frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), runtime.frozen_heap():
        raise RuntimeError('the block fails')
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_before_the_block_stays_frozen():
    gc.freeze()
    try:
        with runtime.frozen_heap():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
