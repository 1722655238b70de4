"""Error messages keep the fix and drop the story: none runs past 3 lines in a terminal.

Read from the source with ``ast`` (nothing is imported): the message of each ``raise X(...)``, each
``parser.error(...)``, ``sys.exit(...)`` and ``print('error: ...')`` in ``vit_plugin/`` and the scripts
under ``tools/`` and ``projects/``, where its text is written in the call or assigned to a name before it
(in the function or at module level). The literal text counts as written, and so does a name of such text
inside an f-string; any other ``{placeholder}`` (or a ``%s``, or the values of ``.format``) counts as a short
value. A line runs to 100 characters, then wraps.
"""
import ast
import math
import os
import os.path as osp
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from helpers.common import REPO

pytestmark = pytest.mark.stack_independent  # this repository's sources only (tests/README.md)

MAX_LINES = 3
LINE_WIDTH = 100
PLACEHOLDER = 'x' * 8  # what a value put into a message is counted as
FOLDERS = ('vit_plugin', 'tools', 'projects')


def message_text(node: ast.AST, names: Dict[str, ast.AST]) -> Optional[str]:
    """The text of a message expression with each placeholder as :data:`PLACEHOLDER`; None where the
    expression holds no literal text (a variable passed on, a call)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # a name of a text assigned before counts as that text
        return ''.join(v.value if isinstance(v, ast.Constant) else message_text(v.value, names) or PLACEHOLDER
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = message_text(node.left, names), message_text(node.right, names)
        if left is None and right is None:
            return None
        return (PLACEHOLDER if left is None else left) + (PLACEHOLDER if right is None else right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):  # '... %s ...' % values
        text = message_text(node.left, names)
        return None if text is None else text.replace('%s', PLACEHOLDER).replace('%r', PLACEHOLDER)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == 'format'):
        text = message_text(node.func.value, names)
        if text is not None:
            return ''.join(PLACEHOLDER if i % 2 else part for i, part in enumerate(_split_fields(text)))
    if isinstance(node, ast.Name) and node.id in names:
        return message_text(names.pop(node.id), names)  # popped: a name that refers to itself ends here
    return None


def _split_fields(text: str) -> List[str]:
    """'a {b} c' -> ['a ', 'b', ' c']: text and ``str.format`` fields in turn."""
    parts, depth, current = [], 0, ''
    for char in text:
        if char == '{' and depth == 0:
            parts.append(current)
            current, depth = '', 1
        elif char == '}' and depth == 1:
            parts.append(current)
            current, depth = '', 0
        else:
            current += char
    return parts + [current]


def terminal_lines(text: str) -> int:
    return sum(max(1, math.ceil(len(line) / LINE_WIDTH)) for line in text.split('\n'))


def _is_error_print(call: ast.Call, text: str) -> bool:
    return isinstance(call.func, ast.Name) and call.func.id == 'print' and 'error' in text[:20].lower()


def _message_call(node: ast.AST) -> Optional[Tuple[List[ast.AST], str]]:
    """(the call's positional arguments, what kind) for a raise / parser.error / sys.exit / print call."""
    if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
        return node.exc.args, 'raise'
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
        owner = ast.unparse(node.func.value)
        if node.func.attr == 'error' and 'parser' in owner:
            return node.args, 'parser.error'
        if owner == 'sys' and node.func.attr == 'exit':
            return node.args, 'sys.exit'
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) and node.func.id == 'print':
        return node.args[:1], 'print'
    return None


def _scopes(tree: ast.AST) -> Iterator[ast.AST]:
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a module or function in source order, without those of the functions inside it."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and scope is not child:
            if isinstance(child, ast.ClassDef):
                yield from _own_nodes(child)
            continue
        yield child
        yield from _own_nodes(child)


def _assignments(nodes: Iterator[ast.AST]) -> Iterator[Tuple[str, ast.AST]]:
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield node.targets[0].id, node.value


def messages(path: str) -> Iterator[Tuple[int, str, str]]:
    """(line, kind, counted text) of each message in the file at ``path``: the first positional argument
    that holds literal text (an error class may take the path first and the message after it)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    module_names = dict(_assignments(ast.iter_child_nodes(tree)))
    for scope in _scopes(tree):
        names: Dict[str, ast.AST] = dict(module_names)
        for node in _own_nodes(scope):
            names.update(_assignments([node]))
            found = _message_call(node)
            if found is None:
                continue
            texts = (message_text(arg, dict(names)) for arg in found[0])
            text = next((t for t in texts if t is not None), None)
            if text is None or (found[1] == 'print' and not _is_error_print(node, text)):
                continue
            yield node.lineno, found[1], text


def source_files(root: str = REPO) -> Iterator[str]:
    for folder in FOLDERS:
        for parent, _, files in os.walk(osp.join(root, folder)):
            for name in sorted(files):
                if name.endswith('.py'):
                    yield osp.join(parent, name)


def long_messages(root: str = REPO) -> List[str]:
    found = []
    for path in source_files(root):
        for line, kind, text in messages(path):
            lines = terminal_lines(text)
            if lines > MAX_LINES:
                found.append(f'{osp.relpath(path, root)}:{line} ({kind}, {lines} lines, {len(text)} characters)')
    return found


def test_no_error_message_runs_past_three_lines():
    found = long_messages()
    assert not found, (f'error messages over {MAX_LINES} lines of {LINE_WIDTH} characters: keep what is wrong, '
                       'where, and what to do:\n' + '\n'.join(found))


def test_the_measure_reads_each_kind_of_message(tmp_path):
    """Literal text, f-strings, concatenation, ``%`` and ``.format``, a name assigned before (also at module
    level, also inside an f-string), the message after a path argument; prints only when they say error."""
    source = tmp_path / 'x.py'
    source.write_text(
        "import sys\n"
        "HINT = 'h'\n"
        "def f(parser, path):\n"
        "    message = 'a' + f'{path}b'\n"
        "    raise ValueError(message)\n"
        "    raise OSError(path, 'c\\nd')\n"
        "    parser.error('%s e' % path)\n"
        "    sys.exit('{} f'.format(path))\n"
        "    print('error: g')\n"
        "    print('fine')\n"
        "    raise KeyError(f'{HINT} i')\n"
        "    raise ValueError(HINT)\n")
    placeholder = PLACEHOLDER
    assert list(messages(str(source))) == [
        (5, 'raise', f'a{placeholder}b'), (6, 'raise', 'c\nd'), (7, 'parser.error', f'{placeholder} e'),
        (8, 'sys.exit', f'{placeholder} f'), (9, 'print', 'error: g'), (11, 'raise', 'h i'),
        (12, 'raise', 'h')]
    assert terminal_lines('x' * 100) == 1 and terminal_lines('x' * 101) == 2 and terminal_lines('a\n\nb') == 3


def test_a_long_message_is_found(tmp_path):
    (tmp_path / 'vit_plugin').mkdir()
    (tmp_path / 'vit_plugin' / 'm.py').write_text("def f():\n    raise ValueError('x' * 0 + '" + 'y' * 301 + "')\n")
    assert long_messages(str(tmp_path)) == ['vit_plugin/m.py:2 (raise, 4 lines, 309 characters)']
