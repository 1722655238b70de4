"""The test files' measured durations, recorded by the suite itself (``tests/durations.json``).

``make test`` hands out whole files in collection order (``--dist loadfile --no-loadscope-reorder``), so
the conftest puts the longest first: the run then ends on short files instead of one worker finishing a
long one while the others idle. The record holds, for each stack, each file's seconds (the sum of its
tests' set-up, call and tear-down times, module fixtures included); a run of the whole suite updates it.
"""
import json
import os
import os.path as osp

from helpers.common import REPO

RECORD = osp.join(REPO, 'tests', 'durations.json')

# A file's recorded seconds change only when a run measures more than this far from them, so that
# ordinary timing noise leaves the committed record alone.
MIN_CHANGE_S = 2.0
MIN_CHANGE_SHARE = 0.25


def read(path: str = RECORD) -> dict:
    """``{stack: {test file relative to the repository: seconds}}``; empty where there is no record."""
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def file_of(nodeid: str) -> str:
    """``tests/engine/test_fsdp2.py::test_x[1]`` -> ``tests/engine/test_fsdp2.py``."""
    return nodeid.split('::', 1)[0]


def merged(recorded: dict, measured: dict, root: str = REPO) -> dict:
    """``recorded`` (one stack's) updated with ``measured``: a file's new time where it moved by more than
    the noise margins, files that no longer exist dropped, rounded to 0.1 s."""
    result = {}
    for name in sorted(set(recorded) | set(measured)):
        if not osp.isfile(osp.join(root, name)):
            continue
        old, new = recorded.get(name), measured.get(name)
        if new is None or (old is not None and abs(new - old) <= max(MIN_CHANGE_S, MIN_CHANGE_SHARE * old)):
            result[name] = old
        else:
            result[name] = round(new, 1)
    return result


def write(record: dict, path: str = RECORD) -> None:
    """Writes ``record`` (sorted, one file a line) where it differs from the file's content."""
    text = json.dumps(record, indent=1, sort_keys=True) + '\n'
    try:
        with open(path, encoding='utf-8') as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    part = path + '.part'
    with open(part, 'w', encoding='utf-8') as f:
        f.write(text)
    os.replace(part, path)
