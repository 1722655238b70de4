"""The installed package is the product: the wheel carries ``vit_plugin`` and nothing of the checkout's
measuring tools (``tools/analysis/benchmarks``) or set-up planner (``tools/setup_plan.py``), and
importing the package, and the modules its registries import on their first lookup, loads none of them
(docs/development.md#layout)."""
import json
import os.path as osp
import runpy
import subprocess
import sys

import setuptools

from helpers.common import REPO

TOOLS = osp.join(REPO, 'tools')
#: Top-level names of the checkout's tools, as a script under tools/ (or the tests) import them.
TOOL_NAMES = ('benchmarks', 'setup_plan', 'tools')

PROBE = r'''
import json, sys

def snapshot():
    return {name: getattr(module, '__file__', None) for name, module in list(sys.modules.items())}

import vit_plugin
after_import = snapshot()

from mmengine.registry import Registry
from vit_plugin import registry
for found in vars(registry).values():  # what mmengine imports on a registry's first lookup
    if isinstance(found, Registry) and found.scope == registry.SCOPE:
        found.import_from_location()
print('RESULT ' + json.dumps(dict(after_import=after_import, after_registries=snapshot())))
'''


def tool_modules(modules):
    """The modules of ``{name: file}`` that are the checkout's tools, by name or by file."""
    return sorted(name for name, path in modules.items()
                  if name.split('.')[0] in TOOL_NAMES or (path and osp.abspath(path).startswith(TOOLS + osp.sep)))


def test_importing_the_package_and_its_registries_loads_none_of_the_tools():
    proc = subprocess.run([sys.executable, '-c', PROBE], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split('RESULT ', 1)[1])
    assert 'vit_plugin.datasets.transforms' in result['after_import']
    assert tool_modules(result['after_import']) == []
    assert tool_modules(result['after_registries']) == []
    assert tool_modules({'benchmarks.timing': None, 'x': osp.join(TOOLS, 'setup_plan.py'),
                         'vit_plugin.zoo': osp.join(REPO, 'vit_plugin', 'zoo.py')}) == ['benchmarks.timing', 'x']


def test_the_wheel_holds_the_package_alone(monkeypatch):
    """setup.py's packages and modules, as setuptools gets them: ``vit_plugin`` and its sub-packages and
    the start-up hook's module; no package of the checkout's tools, no tools file among their files."""
    given = {}
    monkeypatch.setattr(setuptools, 'setup', lambda **kwargs: given.update(kwargs))
    monkeypatch.chdir(REPO)
    runpy.run_path(osp.join(REPO, 'setup.py'))
    packages = given['packages']
    assert 'vit_plugin' in packages and 'vit_plugin.datasets' in packages, packages
    assert all(p == 'vit_plugin' or p.startswith('vit_plugin.') for p in packages), packages
    assert given['py_modules'] == ['_vit_plugin_mmcv_ext']
    folders = [osp.join(REPO, *p.split('.')) for p in packages]
    assert all(osp.isfile(osp.join(folder, '__init__.py')) for folder in folders)
    assert not any(folder.startswith(TOOLS + osp.sep) for folder in folders)
    assert not any(osp.exists(osp.join(folder, 'setup_plan.py')) for folder in folders)
    assert not any('benchmarks' in p.split('.') for p in packages), packages
