"""Which package modules may import which, beyond the layering of test_import_graph.py: the models never
import the converters, the checkpoint package imports neither, and the key names that both share live
in ``vit_plugin.checkpoint.records`` and ``key_maps``, which import nothing from the package."""
import ast
import os
import os.path as osp

import pytest

from helpers.common import REPO

pytestmark = pytest.mark.stack_independent  # this repository's sources only (tests/README.md)


def test_models_do_not_import_converters():
    """Key names live in vit_plugin.checkpoint.records and key_maps, which both use; models never import converters
    and the checkpoint package imports neither (no import cycle)."""
    root = osp.join(REPO, 'vit_plugin')
    for package, forbidden in (('models', ('converters', )), ('checkpoint', ('converters', 'models'))):
        for folder, _, files in os.walk(osp.join(root, package)):
            for name in (f for f in files if f.endswith('.py')):
                path = osp.join(folder, name)
                tree = ast.parse(open(path).read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom):
                        targets = [node.module or ''] + [a.name for a in node.names]
                    elif isinstance(node, ast.Import):
                        targets = [a.name for a in node.names]
                    else:
                        continue
                    for target in targets:
                        parts = target.split('.')
                        assert not any(f in parts for f in forbidden), f'{osp.relpath(path, REPO)} imports {target}'


def test_models_do_not_import_converters_and_key_names_have_one_home():
    """The models' loading code and the converters share key names through vit_plugin.checkpoint.records
    and key_maps, which import nothing from the package; the models never import the converters."""
    package = osp.join(REPO, 'vit_plugin')

    def imported(path):
        names = []
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                names.append('.' * node.level + (node.module or ''))
            elif isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
        return names

    for directory, _, files in os.walk(osp.join(package, 'models')):
        for name in files:
            if name.endswith('.py'):
                path = osp.join(directory, name)
                assert not [m for m in imported(path) if 'converters' in m], path
    for name in ('records.py', 'key_maps.py'):
        names = imported(osp.join(package, 'checkpoint', name))
        assert not [m for m in names if m.startswith('.') or m.startswith('vit_plugin')], (name, names)
