"""The package's own imports run one way.

Every import of a ``vit_plugin`` module by another one, at the top of a file or inside a function, is
read from the source with ``ast`` (nothing is imported). The graph they form must have no cycle,
neither between modules nor between the sub-packages (``vit_plugin.models``, ``vit_plugin.engine``,
...), and ``vit_plugin.engine`` must not import ``vit_plugin.xla``: the XLA path is built on the
engine, not the other way round; ``vit_plugin.compat`` (the private names of dependencies) sits at the bottom
and imports no other part of the package. Imports of the package's own modules sit at the top of their file;
one inside a function is there for an optional dependency and says so in a comment on its line.

``python tests/package/test_import_graph.py`` prints the counts (imports, those inside functions, the
sub-package edges).
"""
import ast
import os
import os.path as osp
from collections import defaultdict
from typing import Dict, List, NamedTuple, Set

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PACKAGE = 'vit_plugin'


class Import(NamedTuple):
    importer: str  # dotted module name of the file holding the import
    imported: str  # dotted module name the import loads (a package's __init__ for `from pkg import name`)
    line: int
    in_function: bool
    statement: int  # id of the import statement (one statement may import several modules)
    commented: bool  # the import's line carries a comment


def package_modules(root: str = REPO) -> Dict[str, str]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    modules = {}
    for folder, _, files in os.walk(osp.join(root, PACKAGE)):
        for name in files:
            if name.endswith('.py'):
                parts = osp.relpath(osp.join(folder, name), root)[:-3].split(os.sep)
                if parts[-1] == '__init__':
                    parts = parts[:-1]
                modules['.'.join(parts)] = osp.join(folder, name)
    return modules


def _targets(node: ast.AST, module: str, is_package: bool, modules: Dict[str, str]) -> List[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ''
    if node.level:  # relative: resolved against the importing module's package
        parts = module.split('.') if is_package else module.split('.')[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = '.'.join(parts + ([base] if base else []))
    # `from pkg import sub` loads the module pkg.sub; `from pkg import name` loads pkg itself.
    return [f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else base for alias in node.names]


def package_imports(root: str = REPO) -> List[Import]:
    """Every import of a package module by a package module under ``root``."""
    modules = package_modules(root)
    found = []
    for module, path in sorted(modules.items()):
        with open(path) as f:
            source = f.read()
        lines = source.splitlines()
        statement_ids = iter(range(1 << 30))

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    statement = next(statement_ids)
                    commented = '#' in lines[child.end_lineno - 1]
                    for target in _targets(child, module, path.endswith('__init__.py'), modules):
                        if target == PACKAGE or target.startswith(PACKAGE + '.'):
                            found.append(Import(module, target, child.lineno, in_function,
                                                (module, statement), commented))
                nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, in_function or nested)
        visit(ast.parse(source, path), False)
    return found


def subpackage(module: str) -> str:
    """``vit_plugin.engine.hooks.x`` -> ``vit_plugin.engine``; modules at the root stand for themselves."""
    return '.'.join(module.split('.')[:2])


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def graph(imports: List[Import], level=lambda m: m) -> Dict[str, Set[str]]:
    edges = defaultdict(set)
    for imp in imports:
        a, b = level(imp.importer), level(imp.imported)
        if a != b:
            edges[a].add(b)
    return edges


def _where(imports: List[Import], a: str, b: str, level) -> str:
    return ', '.join(f'{i.importer}:{i.line}' for i in imports if level(i.importer) == a and level(i.imported) == b)


def _explain(imports, components, level) -> str:
    lines = []
    for component in components:
        members = set(component)
        lines.append(' <-> '.join(component))
        edges = graph([i for i in imports if level(i.importer) in members and level(i.imported) in members], level)
        for a in sorted(edges):
            for b in sorted(edges[a]):
                lines.append(f'    {a} -> {b} ({_where(imports, a, b, level)})')
    return '\n'.join(lines)


def test_no_cycle_between_modules():
    imports = package_imports()
    components = cycles(graph(imports))
    assert not components, 'modules that import each other:\n' + _explain(imports, components, lambda m: m)


def test_no_cycle_between_subpackages():
    imports = package_imports()
    components = cycles(graph(imports, subpackage))
    assert not components, 'sub-packages that import each other:\n' + _explain(imports, components, subpackage)


def test_engine_does_not_import_xla():
    wrong = [f'{i.importer}:{i.line} imports {i.imported}' for i in package_imports()
             if subpackage(i.importer) == f'{PACKAGE}.engine' and subpackage(i.imported) == f'{PACKAGE}.xla']
    assert not wrong, 'the engine must not depend on the XLA path:\n' + '\n'.join(wrong)


def test_compat_imports_nothing_else_of_the_package():
    compat = f'{PACKAGE}.compat'
    wrong = [f'{i.importer}:{i.line} imports {i.imported}' for i in package_imports()
             if subpackage(i.importer) == compat and subpackage(i.imported) != compat]
    assert not wrong, (f'{compat} must import only its dependencies, so that every layer can use it:\n'
                       + '\n'.join(wrong))


def test_package_imports_sit_at_the_top_or_say_why():
    local = [f'{i.importer}:{i.line} imports {i.imported}' for i in package_imports()
             if i.in_function and not i.commented]
    assert not local, ('imports of vit_plugin modules inside functions hide the graph: move them to the top of '
                       'the file, or say on the line which optional dependency keeps them local:\n'
                       + '\n'.join(local))


def test_the_walk_sees_relative_and_local_imports(tmp_path):
    """The walk itself, on a made-up package: relative imports resolve, imports inside functions count,
    and a cycle through a function-level import is found."""
    pkg = tmp_path / PACKAGE
    for sub in ('a', 'b'):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / '__init__.py').write_text('')
    (pkg / '__init__.py').write_text('from . import a\n')
    (pkg / 'a' / 'low.py').write_text('import os\nfrom ..b.high import thing\n')
    (pkg / 'b' / 'high.py').write_text('def f():\n    from vit_plugin.a import low  # optional: demo\n'
                                       'thing = 1\n')
    imports = package_imports(str(tmp_path))
    assert {(i.importer, i.imported, i.in_function, i.commented) for i in imports} == {
        ('vit_plugin', 'vit_plugin.a', False, False),
        ('vit_plugin.a.low', 'vit_plugin.b.high', False, False),
        ('vit_plugin.b.high', 'vit_plugin.a.low', True, True)}
    assert cycles(graph(imports)) == [['vit_plugin.a.low', 'vit_plugin.b.high']]
    assert cycles(graph(imports, subpackage)) == [['vit_plugin.a', 'vit_plugin.b']]


def counts(root: str = REPO) -> dict:
    imports = package_imports(root)
    statements = {i.statement for i in imports}
    local = {i.statement for i in imports if i.in_function}
    return dict(import_statements=len(statements), inside_functions=len(local),
                subpackage_edges={a: sorted(b) for a, b in sorted(graph(imports, subpackage).items())})


if __name__ == '__main__':
    import json
    import sys
    print(json.dumps(counts(sys.argv[1] if len(sys.argv) > 1 else REPO), indent=1))
