"""Private names of the dependencies are used only in ``vit_plugin/compat/``.

The sources under ``vit_plugin/`` (except ``vit_plugin/compat/``), ``tools/`` and ``projects/`` are read
with ``ast`` and must not:

1. import a module of a dependency whose path has a private part (``from mmengine._strategy import``);
2. import a private name from a dependency (``from mmengine.fileio.io import _parse_uri_prefix``);
3. name, define, or pass to ``getattr``/``hasattr``/``setattr`` one of the private names the compat
   modules use, except a name a compat module's ``INHERITED`` allows in that class or function;
4. reach a private attribute through a dependency's module or a name imported from it
   (``torch._foreach_norm``, ``nn.modules.batchnorm._BatchNorm``);
5. name a dependency's private module as a string (``sys.modules.get('torch.utils.data._utils...')``).

A sixth check imports the package: a private member that one of our classes overrides or reads through
``self`` must be one that a dependency's class defines only if ``INHERITED`` lists it for that class,
and every ``INHERITED`` entry must still exist on its owner in the installed versions.

``tests/`` is exempt: tests reset and inspect dependencies' private state on purpose (the default scope's
instances, the checkpoint loader's table), and a break there fails the suite, not a user's run.
``_vit_plugin_mmcv_ext.py`` provides ``mmcv._ext`` itself and is loaded before ``vit_plugin``.
"""
import ast
import importlib
import inspect
import os
import os.path as osp
import re
from typing import Dict, Iterator, List, Set, Tuple

import pytest
from helpers.common import REPO

DEPENDENCIES = ('mmengine', 'mmcv', 'mmdet', 'mmpretrain', 'torch', 'torchvision', 'torch_xla', 'numpy')
SCANNED = ('vit_plugin', 'tools', 'projects')
COMPAT = osp.join('vit_plugin', 'compat')
COMPAT_MODULES = ('mmengine', 'mmcv', 'mmdet', 'mmpretrain', 'torch', 'torchvision', 'torch_xla', 'numpy')
FIX = 'add a function to vit_plugin/compat/<dependency>.py (what, why no public way, versions checked) and call it'
_ATTR_CALLS = ('getattr', 'hasattr', 'setattr', 'delattr')


def private(name: str) -> bool:
    return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def _is_dependency(module: str) -> bool:
    return module.split('.')[0] in DEPENDENCIES


def _dotted_private_path(value: str) -> bool:
    return bool(re.fullmatch(r'[A-Za-z_]\w*(\.\w+)+', value)) and _is_dependency(value) and any(
        private(part) for part in value.split('.'))


def _attr_call_name(node: ast.Call):
    if (isinstance(node.func, ast.Name) and node.func.id in _ATTR_CALLS and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


def declared_names(sources: List[str]) -> Set[str]:
    """Every private name the compat modules touch: attributes, imported names and module parts,
    names read with ``getattr``/``hasattr``."""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and _is_dependency(node.module or ''):
                names.update(p for p in (node.module or '').split('.') if private(p))
                names.update(a.name for a in node.names if private(a.name))
            elif isinstance(node, ast.Call) and private(_attr_call_name(node) or ''):
                names.add(_attr_call_name(node))
    return names


def _scopes(tree: ast.AST) -> Iterator[Tuple[ast.AST, str]]:
    """Every node with the dotted qualname of the class/function it sits in ('' at module level)."""
    def walk(node, qual):
        for child in ast.iter_child_nodes(node):
            yield child, qual
            inner = qual
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = f'{qual}.{child.name}' if qual else child.name
            yield from walk(child, inner)
    yield from walk(tree, '')


def _allowed(name: str, module: str, qual: str, inherited: Dict[str, Set[str]]) -> bool:
    for user in inherited.get(name, ()):
        user_module, _, user_qual = user.partition(':')
        if user_module == module and (qual == user_qual or qual.startswith(user_qual + '.')):
            return True
    return False


def violations(source: str, module: str, declared: Set[str], inherited: Dict[str, Set[str]]) -> List[str]:
    """``line: what`` for each private access of a dependency in one file outside compat."""
    tree = ast.parse(source)
    from_dependency = set()  # local names bound to a dependency's module or to a name imported from one
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_dependency(alias.name):
                    from_dependency.add(alias.asname or alias.name.split('.')[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_dependency(node.module or ''):
            from_dependency.update(alias.asname or alias.name for alias in node.names)
    class_members = {child for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for child in node.body}
    found = []
    for node, qual in _scopes(tree):
        line = getattr(node, 'lineno', 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_dependency(alias.name) and any(private(p) for p in alias.name.split('.')):
                    found.append(f'{line}: import {alias.name} (a private module)')
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_dependency(node.module or ''):
            if any(private(p) for p in node.module.split('.')):
                found.append(f'{line}: from {node.module} import ... (a private module)')
            for alias in node.names:
                if private(alias.name):
                    found.append(f'{line}: from {node.module} import {alias.name} (a private name)')
        elif isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in from_dependency:
                found.append(f'{line}: {ast.unparse(node)} (private attribute of a dependency)')
            elif node.attr in declared and not _allowed(node.attr, module, qual, inherited):
                found.append(f'{line}: {ast.unparse(node)} (private name of a dependency)')
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in declared:
            if node in class_members and not _allowed(node.name, module, qual, inherited):
                found.append(f'{line}: def {node.name} (overrides a private member of a dependency)')
        elif isinstance(node, ast.Call):
            name = _attr_call_name(node)
            if name in declared and not _allowed(name, module, qual, inherited):
                found.append(f'{line}: {ast.unparse(node)} (private name of a dependency)')
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _dotted_private_path(node.value):
            found.append(f'{line}: {node.value!r} (a private module of a dependency)')
    return found


def _scanned_files() -> Iterator[Tuple[str, str]]:
    for top in SCANNED:
        for folder, _, files in os.walk(osp.join(REPO, top)):
            rel = osp.relpath(folder, REPO)
            if rel == COMPAT or rel.startswith(COMPAT + os.sep):
                continue
            for name in sorted(files):
                if name.endswith('.py'):
                    path = osp.join(folder, name)
                    parts = osp.relpath(path, REPO)[:-3].split(os.sep)
                    yield path, '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def compat_records():
    """(names the compat modules touch, private member -> allowed users) from the compat sources and their
    ``INHERITED`` tables (read with ``ast``: the torch_xla module needs no torch_xla for this)."""
    sources, inherited = [], {}
    for dep in COMPAT_MODULES:
        with open(osp.join(REPO, COMPAT, f'{dep}.py')) as f:
            source = f.read()
        sources.append(source)
        module = importlib.import_module(f'vit_plugin.compat.{dep}')
        for name, record in getattr(module, 'INHERITED', {}).items():
            inherited.setdefault(name, set()).update(record.users)
    return declared_names(sources) | set(inherited), inherited


def test_no_private_access_outside_compat():
    declared, inherited = compat_records()
    report = []
    for path, module in _scanned_files():
        with open(path) as f:
            source = f.read()
        report += [f'{osp.relpath(path, REPO)}:{v}' for v in violations(source, module, declared, inherited)]
    assert not report, (f'private names of dependencies outside vit_plugin/compat/; {FIX}\n'
                        '(a private member our subclass overrides: list it in that module\'s INHERITED):\n'
                        + '\n'.join(report))


def test_each_kind_of_access_is_reported():
    """The checks themselves, on made-up sources: one access of each kind is found, the allowed
    override is not."""
    declared = {'_per_optimizer_states', '_save_checkpoint_with_step', '_resume'}
    inherited = {'_save_checkpoint_with_step': {'pkg.mod:Allowed'}}
    cases = {
        'from mmengine._strategy import DDPStrategy': 'private module',
        'import torch.utils._pytree': 'private module',
        'from mmengine.fileio.io import _parse_uri_prefix': 'private name',
        'x = scaler._per_optimizer_states': 'private name of a dependency',
        'import torch\nn = torch._foreach_norm': 'private attribute of a dependency',
        'import torch_xla as xla\nxla._XLAC.f()': 'private attribute of a dependency',
        'import torch.nn as nn\nB = nn.modules.batchnorm._BatchNorm': 'private attribute of a dependency',
        'class H:\n    def _save_checkpoint_with_step(self): pass': 'overrides a private member',
        'r = getattr(runner, "_resume", False)': 'private name of a dependency',
        'import sys\nsys.modules.get("torch.utils.data._utils.signal_handling")': 'private module of a dependency',
    }
    for source, kind in cases.items():
        found = violations(source, 'pkg.mod', declared, inherited)
        assert len(found) == 1 and kind in found[0], (source, found)
    allowed = 'class Allowed(Base):\n    def _save_checkpoint_with_step(self):\n        super()._save_checkpoint_with_step()'
    assert violations(allowed, 'pkg.mod', declared, inherited) == []
    assert violations(allowed.replace('Allowed', 'Other'), 'pkg.mod', declared, inherited)
    assert violations('import os\nos._exit(0)\nself._own = 1\ndef _resume(): pass', 'pkg.mod', declared,
                      inherited) == []


def _owner_has(owner: str, name: str) -> bool:
    module, _, qual = owner.partition(':')
    cls = importlib.import_module(module)
    for part in qual.split('.'):
        cls = getattr(cls, part)
    for base in cls.__mro__:
        if name in vars(base):
            return True
        try:
            if re.search(rf'\b(self|cls)\.{re.escape(name)}\b', inspect.getsource(base)):
                return True
        except (OSError, TypeError):
            continue
    return False


def _inherited_records():
    for dep in COMPAT_MODULES:
        if dep == 'torch_xla':
            continue  # no INHERITED entries; importing its users needs torch_xla
        for name, record in importlib.import_module(f'vit_plugin.compat.{dep}').INHERITED.items():
            yield dep, name, record


@pytest.mark.parametrize('dep,name,record', list(_inherited_records()), ids=lambda v: v if isinstance(v, str) else '')
def test_inherited_members_still_exist(dep, name, record):
    assert _owner_has(record.owner, name), (
        f'{record.owner} has no {name} in this {dep}: the subclasses {record.users} rely on it '
        f'({record.why}); adapt them and vit_plugin/compat/{dep}.py')


def _dependency_members(cls) -> Set[str]:
    members = set()
    for base in cls.__mro__[1:]:
        if not _is_dependency(base.__module__):
            continue
        members.update(n for n in vars(base) if private(n))
        try:
            members.update(re.findall(r'\bself\.(_\w+)', inspect.getsource(base)))
        except (OSError, TypeError):
            pass
    return {m for m in members if private(m)}


def test_every_inherited_private_member_is_declared():
    """A private member our class uses through ``self``/``super()``/``def`` that a dependency's base
    class defines must be listed in the dependency's ``INHERITED`` for that class."""
    _, inherited = compat_records()
    report, skipped = [], []
    for path, module in _scanned_files():
        if not module.startswith('vit_plugin.'):
            continue
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name and error.name.split('.')[0] in DEPENDENCIES:  # an optional dependency (torch_xla)
                skipped.append(module)
                continue
            raise
        with open(path) as f:
            tree = ast.parse(f.read())
        for node, qual in _scopes(tree):
            if not isinstance(node, ast.ClassDef) or qual:
                continue
            cls = getattr(loaded, node.name, None)
            if not inspect.isclass(cls):
                continue
            members = _dependency_members(cls)
            used = set()
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and inner.attr in members and (
                        isinstance(inner.value, ast.Name) and inner.value.id in ('self', 'cls')
                        or isinstance(inner.value, ast.Call) and ast.unparse(inner.value.func) == 'super'):
                    used.add(inner.attr)
                elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner.name in members:
                    used.add(inner.name)
            report += [f'{module}:{node.name} uses {name}' for name in sorted(used)
                       if not _allowed(name, module, node.name, inherited)]
    assert not report, ('private members of dependencies\' classes used by our subclasses but not listed in '
                        'INHERITED of vit_plugin/compat/<dependency>.py; add them (owner, users, why):\n'
                        + '\n'.join(report))
