"""Install vit_plugin. Two stacks are tested, each pinned in requirements/<stack>/lock.txt
(docs/installation.md#two-stacks); the ranges below are for users who bring their own torch and OpenMMLab.

The OpenMMLab packages are extras, never plain requirements: the maintained forks (``onedl-mmengine``,
``onedl-mmcv``, ``onedl-mmpretrain``, ``onedl-mmdetection``) install the same import names as the upstream
releases, so a plain requirement on ``mmengine`` would put the upstream files over a fork's. Pick one:

- ``pip install 'vit_plugin[onedl]'``: the maintained forks (torch >= 2.10, numpy 2). ``onedl-mmcv`` is a
  source package; built without torch in its build environment (pip's default) it has no compiled
  operators, and vit_plugin provides the ones its models use (NMS, RoIAlign, sigmoid focal loss).
- ``pip install 'vit_plugin[openmmlab,lite]'``: the upstream releases with ``mmcv-lite``; ``[openmmlab,mim]``
  with a compiled mmcv 2.0-2.1 instead; ``[openmmlab]`` alone keeps an mmcv already installed.
- An environment that has either stack already: a plain ``pip install vit_plugin`` adds none of them.
- Without either, ``import vit_plugin`` stops with an error that names both.

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
        'safetensors',  # the checkpoint format that cannot run code
    ],
    extras_require={
        'onedl': ['onedl-mmengine>=0.10.8', 'onedl-mmcv>=2.3', 'onedl-mmpretrain>=1.3', 'onedl-mmdetection>=3.4',
                  'pycocotools'],
        'openmmlab': ['mmengine>=0.10.3,<1.0', 'mmpretrain>=1.2.0,<2.0', 'mmdet>=3.3.0,<3.4', 'pycocotools',
                      'setuptools<81', 'numpy<2'],  # mmengine 0.10.7 imports pkg_resources; all predate numpy 2
        'lite': ['mmcv-lite>=2.0.0,<2.2.0'],  # mmdet 3.3.0 refuses mmcv >= 2.2
        'mim': ['mmcv>=2.0.0,<2.2.0'],  # compiled mmcv (builds from source where no wheel fits your torch)
        'xla': ['torch-xla'],
        # Tar shards on remote file systems (vit_plugin/datasets/shard_files.py): http(s) needs aiohttp, hf://
        # needs huggingface_hub; s3:// and gs:// need s3fs / gcsfs, which users add for their bucket.
        'data': ['fsspec>=2023.1', 'aiohttp', 'huggingface_hub>=0.20'],
        # Dashboards (docs/monitoring.md): `--vis tensorboard`; W&B and MLflow are the user's own installs.
        'vis': ['tensorboard'],
        'tests': ['pytest', 'pytest-xdist', 'import-linter', 'timm>=1.0', 'scipy', 'scikit-learn', 'matplotlib',
                  'transformers<5', 'fsspec>=2023.1', 'aiohttp', 'huggingface_hub>=0.20', 'webdataset'],
        'deploy': ['onnx', 'onnxruntime'],
    },
)
