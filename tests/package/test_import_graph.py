"""The package's own imports run one way.

The rules are import-linter contracts in ``.importlinter`` at the repository root (the layers, no
cycles, the engine without ``xla``, ``compat`` without the rest of the package); each contract is one
test here, which runs ``lint-imports`` on it. Four rules import-linter cannot state are checked below:

- no cycle through a package's own ``__init__`` (``engine/__init__.py`` imports ``engine.preemption``,
  which imports ``vit_plugin.engine``; or a module that imports the root ``vit_plugin``, which imports
  every sub-package): the ``acyclic_siblings`` contract sees only imports between siblings, and a
  forbidden contract per package would also ban the harmless imports of a package's ``__init__`` by its
  modules (``compat.mmdet`` uses ``compat.Inherited``). Read from grimp's graph;
- imports of the package's own modules sit at the top of their file; one inside a function is there for
  an optional dependency and says so in a comment on its line (import-linter does not record where an
  import sits). Read with ``ast``;
- the scripts under ``tools/`` and ``projects/`` never edit ``sys.path`` (they import the installed
  package). Read with ``ast``;
- ``os.register_at_fork`` and ``gc.freeze`` / ``gc.unfreeze`` are called only in ``vit_plugin.runtime``,
  the home of process-level effects (the ``signal`` module is the process-effects contract). Read with
  ``ast``.
"""
import ast
import configparser
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, NamedTuple

import grimp
import pytest
from helpers.common import REPO

pytestmark = pytest.mark.stack_independent  # this repository's sources only (tests/README.md)

PACKAGE = 'vit_plugin'
CONTRACTS = osp.join(REPO, '.importlinter')


def contract_ids() -> List[str]:
    config = configparser.ConfigParser()
    config.read(CONTRACTS)
    prefix = 'importlinter:contract:'
    return [section[len(prefix):] for section in config.sections() if section.startswith(prefix)]


def test_the_contracts_are_all_there():
    assert set(contract_ids()) >= {'layers', 'acyclic', 'engine-xla', 'compat', 'process-effects'}, contract_ids()


@pytest.mark.parametrize('contract', contract_ids())
def test_import_contract(contract):
    lint_imports = osp.join(osp.dirname(sys.executable), 'lint-imports')
    # From the repository root: lint-imports reads .importlinter there and puts the root first on sys.path,
    # so this checkout's sources are read.
    proc = subprocess.run([lint_imports, '--no-cache', '--contract', contract],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def cycles_through_own_package(package: str = PACKAGE) -> List[str]:
    """Each import of a package's ``__init__`` by one of its own modules that the package imports back."""
    graph = grimp.build_graph(package, cache_dir=None)
    found = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if module.startswith(imported + '.') and graph.chain_exists(importer=imported, imported=module):
                back = ' -> '.join(graph.find_shortest_chain(importer=imported, imported=module))
                found.append(f'{module} imports {imported}, which imports it back: {back}')
    return found


def test_no_cycle_through_a_package_init():
    found = cycles_through_own_package()
    assert not found, 'modules that import each other:\n' + '\n'.join(found)


class LocalImport(NamedTuple):
    where: str  # file:line
    imported: str
    commented: bool  # the import's last line carries a comment


def _targets(node: ast.AST, module: str, is_package: bool) -> List[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ''
    if node.level:  # relative: resolved against the importing module's package
        parts = module.split('.') if is_package else module.split('.')[:-1]
        base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
    return [base]


def package_files(root: str) -> Dict[str, str]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    modules = {}
    for folder, _, files in os.walk(osp.join(root, PACKAGE)):
        for name in files:
            if name.endswith('.py'):
                parts = osp.relpath(osp.join(folder, name), root)[:-3].split(os.sep)
                modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = osp.join(folder, name)
    return modules


def local_imports(root: str = REPO) -> List[LocalImport]:
    """Every import of a package module inside a function of a package module under ``root``."""
    found = []
    for module, path in sorted(package_files(root).items()):
        with open(path) as f:
            source = f.read()
        lines = source.splitlines()
        for function in ast.walk(ast.parse(source, path)):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for target in _targets(node, module, path.endswith('__init__.py')):
                        if target == PACKAGE or target.startswith(PACKAGE + '.'):
                            found.append(LocalImport(f'{osp.relpath(path, root)}:{node.lineno}', target,
                                                     '#' in lines[node.end_lineno - 1]))
    return sorted(set(found))


def test_package_imports_sit_at_the_top_or_say_why():
    local = [f'{i.where} imports {i.imported}' for i in local_imports() if not i.commented]
    assert not local, ('imports of vit_plugin modules inside functions hide the graph: move them to the top of '
                       'the file, or say on the line which optional dependency keeps them local:\n'
                       + '\n'.join(local))


def sys_path_edits(folder: str) -> List[str]:
    """``sys.path`` changes (assignment, ``insert``/``append``/``extend``..., ``site.addsitedir``) in the
    Python files under ``folder``, as file:line."""
    found = []
    for parent, _, files in os.walk(folder):
        for name in sorted(files):
            if not name.endswith('.py'):
                continue
            path = osp.join(parent, name)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in sorted(ast.walk(tree), key=lambda node: getattr(node, 'lineno', 0)):
                target = None
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    target = ast.unparse(node.func)
                    if target != 'site.addsitedir' and not target.startswith('sys.path.'):
                        target = None
                elif isinstance(node, (ast.Assign, ast.AugAssign)):
                    names = [ast.unparse(t) for t in getattr(node, 'targets', [getattr(node, 'target', None)])]
                    target = next((n for n in names if n == 'sys.path' or n.startswith('sys.path[')), None)
                if target:
                    found.append(f'{osp.relpath(path, REPO)}:{node.lineno} ({target})')
    return found


def test_tools_and_projects_leave_sys_path_alone():
    edits = [edit for folder in ('tools', 'projects') for edit in sys_path_edits(osp.join(REPO, folder))]
    assert not edits, ('scripts import the installed package (`make setup` installs it editable); '
                       'drop these sys.path changes:\n' + '\n'.join(edits))


#: module -> its functions with a process-level effect that only ``vit_plugin.runtime`` calls.
RUNTIME_ONLY = {'os': {'register_at_fork'}, 'gc': {'freeze', 'unfreeze'}}
RUNTIME_PACKAGE = PACKAGE + '.runtime'


def process_effects(root: str = REPO) -> List[str]:
    """``file:line (os.register_at_fork)`` for each use of a :data:`RUNTIME_ONLY` function in a package
    module outside ``vit_plugin.runtime`` (``import gc as g; g.freeze``, ``from os import register_at_fork``
    included)."""
    found = []
    for module, path in sorted(package_files(root).items()):
        if module == RUNTIME_PACKAGE or module.startswith(RUNTIME_PACKAGE + '.'):
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        aliases = {}  # local name -> module of RUNTIME_ONLY
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update({(a.asname or a.name): a.name for a in node.names if a.name in RUNTIME_ONLY})
            elif isinstance(node, ast.ImportFrom) and node.module in RUNTIME_ONLY and not node.level:
                for alias in node.names:
                    if alias.name in RUNTIME_ONLY[node.module]:
                        found.append(f'{osp.relpath(path, root)}:{node.lineno} ({node.module}.{alias.name})')
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.attr in RUNTIME_ONLY.get(aliases.get(node.value.id), ())):
                found.append(f'{osp.relpath(path, root)}:{node.lineno} ({aliases[node.value.id]}.{node.attr})')
    return sorted(found)


def test_fork_hooks_and_gc_freezes_live_in_the_runtime_package():
    found = process_effects()
    assert not found, (f'at-fork hooks and gc.freeze are process-level effects: install them through '
                       f'{RUNTIME_PACKAGE} (install_fork_hook, frozen_heap), which undoes them when what needs '
                       'them ends:\n' + '\n'.join(found))


def test_the_process_effect_check_sees_each_spelling(tmp_path):
    own = tmp_path / 'repo' / PACKAGE
    (own / 'runtime').mkdir(parents=True)
    (own / '__init__.py').write_text('')
    (own / 'runtime' / '__init__.py').write_text('import gc\ngc.freeze()\n')
    (own / 'a.py').write_text('import gc as g\nimport os\nfrom os import register_at_fork\n'
                              'g.collect()\ng.unfreeze()\nos.register_at_fork(after_in_child=print)\n'
                              'model = None\nmodel.freeze()\n')
    assert process_effects(str(tmp_path / 'repo')) == [
        f'{PACKAGE}/a.py:3 (os.register_at_fork)', f'{PACKAGE}/a.py:5 (gc.unfreeze)',
        f'{PACKAGE}/a.py:6 (os.register_at_fork)']


def test_the_checks_see_what_they_look_for(tmp_path, monkeypatch):
    """On a made-up package and scripts: a cycle through a package's ``__init__`` is found (and an import
    of it that is not imported back is not), local imports resolve and their comment counts, and each kind
    of ``sys.path`` change is found."""
    pkg = tmp_path / 'madeup_pkg'
    (pkg / 'sub').mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'sub' / '__init__.py').write_text('from . import low\nNAME = 1\n')
    (pkg / 'sub' / 'low.py').write_text('from madeup_pkg.sub import NAME\n')
    (pkg / 'other.py').write_text('import madeup_pkg\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles_through_own_package('madeup_pkg') == [
        'madeup_pkg.sub.low imports madeup_pkg.sub, which imports it back: madeup_pkg.sub -> madeup_pkg.sub.low']

    own = tmp_path / 'repo' / PACKAGE
    (own / 'a').mkdir(parents=True)
    (own / '__init__.py').write_text('')
    (own / 'a' / '__init__.py').write_text('def f():\n    from . import b  # optional: demo\n')
    (own / 'a' / 'c.py').write_text('import os\nfrom ..a import b\n\ndef g():\n    from .b import x\n'
                                    '    import numpy\n')
    assert local_imports(str(tmp_path / 'repo')) == [
        LocalImport(f'{PACKAGE}/a/__init__.py:2', f'{PACKAGE}.a', True),
        LocalImport(f'{PACKAGE}/a/c.py:5', f'{PACKAGE}.a.b', False)]

    scripts = tmp_path / 'scripts'
    scripts.mkdir()
    (scripts / 'x.py').write_text('import sys, site\nsys.path.insert(0, "..")\nsys.path = []\n'
                                  'sys.path[0:0] = ["a"]\nsite.addsitedir("b")\nprint(sys.path)\n')
    assert [edit.split('x.py:', 1)[1] for edit in sys_path_edits(str(scripts))] == [
        '2 (sys.path.insert)', '3 (sys.path)', '4 (sys.path[0:0])', '5 (site.addsitedir)']
