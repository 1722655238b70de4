"""``import vit_plugin`` registers and leaves the process alone: in a fresh interpreter, with counters
installed before the import, it registers no at-fork hook, installs no signal handler, replaces neither
stdout nor stderr (not even for a while) and freezes no part of the heap (docs/development.md#what-importing-does)."""
import json
import subprocess
import sys

from helpers.common import REPO

PROBE = r'''
import contextlib, gc, json, os, signal, sys

calls = {'at_fork': [], 'signal': 0, 'freeze': 0, 'redirect': 0}

def counted(key, function, record=None):
    def wrapper(*args, **kwargs):
        if record is None:
            calls[key] += 1
        else:
            calls[key].extend(record(*args, **kwargs))
        return function(*args, **kwargs)
    return wrapper

os.register_at_fork = counted('at_fork', os.register_at_fork,
                              lambda **hooks: [str(getattr(f, '__module__', None)) for f in hooks.values()])
signal.signal = counted('signal', signal.signal)
gc.freeze = counted('freeze', gc.freeze)
contextlib.redirect_stdout = counted('redirect', contextlib.redirect_stdout)
contextlib.redirect_stderr = counted('redirect', contextlib.redirect_stderr)
handlers = {s: signal.getsignal(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}
stdout, stderr = sys.stdout, sys.stderr

import vit_plugin
from vit_plugin.registry import MODELS

result = dict(
    registered='ViT' in MODELS.module_dict,
    own_at_fork=[m for m in calls['at_fork'] if m.startswith('vit_plugin')],
    signal_calls=calls['signal'],
    changed_handlers=sorted(signal.Signals(s).name for s, h in handlers.items() if signal.getsignal(s) is not h),
    same_stdout=sys.stdout is stdout, same_stderr=sys.stderr is stderr, redirects=calls['redirect'],
    freezes=calls['freeze'], freeze_count=gc.get_freeze_count())

# The counters see the runtime's effects once something asks for them.
from vit_plugin import runtime
runtime.install_fork_hook('probe', lambda: None)
with runtime.SignalHandlers([signal.SIGUSR2], lambda signum, frame: None), runtime.frozen_heap():
    pass
result['seen_after'] = dict(own_at_fork=[m for m in calls['at_fork'] if m.startswith('vit_plugin')],
                            signal_calls=calls['signal'], freezes=calls['freeze'])
print('RESULT ' + json.dumps(result))
'''


def test_importing_registers_and_leaves_the_process_alone():
    proc = subprocess.run([sys.executable, '-c', PROBE], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split('RESULT ', 1)[1])
    assert result.pop('seen_after') == dict(own_at_fork=['vit_plugin.runtime.process'], signal_calls=2, freezes=1)
    assert result == dict(registered=True, own_at_fork=[], signal_calls=0, changed_handlers=[], same_stdout=True,
                          same_stderr=True, redirects=0, freezes=0, freeze_count=0)
