"""Install vit_plugin. The tested stack is pinned in requirements/lock.txt; the ranges below are
for users who bring their own torch (e.g. a CUDA build) and OpenMMLab packages.

mmcv is deliberately not in ``install_requires`` (as in mmdet's and mmpretrain's own packages): either
mmcv distribution satisfies vit_plugin, and pip cannot express "one of the two".

- ``pip install -e .[lite]`` adds ``mmcv-lite`` (no compiled code; vit_plugin provides NMS, RoIAlign and
  the sigmoid focal loss from torchvision). This is what ``make setup`` installs.
- An environment with a compiled mmcv 2.0-2.1 (``mim install mmcv``, or ``MMCV_OPS=compiled make
  setup``) keeps it: a plain ``pip install -e .`` leaves it untouched and vit_plugin uses it.
- Without either, ``import vit_plugin`` stops with an error that says what to install.

The wheel also carries ``vit_plugin_mmcv_ext.pth``, which makes ``import mmcv._ext`` find vit_plugin's
operators when mmcv has none, whatever a script imports first (``_vit_plugin_mmcv_ext.py``).
"""
import importlib.util
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

PTH = 'vit_plugin_mmcv_ext.pth'
HERE = os.path.dirname(os.path.abspath(__file__))

with open('vit_plugin/version.py') as f:
    version = f.read().split("'")[1]


def _write_startup_hook(site_dir):
    spec = importlib.util.spec_from_file_location('hook', os.path.join(HERE, '_vit_plugin_mmcv_ext.py'))
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook.write_startup_file(site_dir)


class BuildWithStartupHook(build_py):
    """Puts the start-up ``.pth`` at the top of the wheel (site-packages), as setuptools does for its own
    ``distutils-precedence.pth``; in an editable (PEP 660) build, at the top of the editable wheel."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):  # the editable wheel is made of install_lib's files
            os.makedirs(self.get_finalized_command('install').install_lib, exist_ok=True)
            _write_startup_hook(self.get_finalized_command('install').install_lib)
        else:
            _write_startup_hook(self.build_lib)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


class DevelopWithStartupHook(develop):
    """``setup.py develop`` (how pip installs a project without pyproject.toml in editable mode while
    setuptools < 80): the ``.pth`` too. (setuptools 80's ``develop`` calls pip, whose editable wheel gets the
    ``.pth`` from :class:`BuildWithStartupHook`.)"""

    def run(self):
        super().run()
        site_dir = getattr(self, 'install_dir', None)
        if site_dir and not getattr(self, 'uninstall', False):
            _write_startup_hook(site_dir)


setup(
    name='vit_plugin',
    version=version,
    description='The Vision Transformer paper (Dosovitskiy et al., ICLR 2021) as an OpenMMLab plugin',
    long_description=open('README.md').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['vit_plugin', 'vit_plugin.*']),
    py_modules=['_vit_plugin_mmcv_ext'],
    cmdclass={'build_py': BuildWithStartupHook, 'develop': DevelopWithStartupHook},
    python_requires='>=3.10',
    install_requires=[
        'torch>=2.1',
        'torchvision>=0.16',  # mmpretrain imports it; vit_plugin.ops runs its NMS / RoIAlign kernels
        'numpy',
        'mmengine>=0.10.3,<1.0',
        'mmpretrain>=1.2.0,<2.0',
        'setuptools<81',  # mmengine imports pkg_resources, removed in setuptools 81
    ],
    extras_require={
        'lite': ['mmcv-lite>=2.0.0,<2.2.0'],  # mmdet 3.3.0 refuses mmcv >= 2.2
        'mim': ['mmcv>=2.0.0,<2.2.0'],  # compiled mmcv (builds from source where no wheel fits your torch)
        'xla': ['torch-xla'],
        'det': ['mmdet>=3.3.0,<3.4', 'pycocotools'],
        'tests': ['pytest', 'pytest-xdist', 'timm>=1.0', 'scipy', 'scikit-learn', 'matplotlib'],
        'deploy': ['onnx', 'onnxruntime'],
    },
)
