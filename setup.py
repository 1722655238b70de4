"""Install vit_plugin. The tested stack is pinned in requirements/lock.txt; the ranges below are
for users who bring their own torch (e.g. a CUDA build) and OpenMMLab packages."""
from setuptools import find_packages, setup

with open('vit_plugin/version.py') as f:
    version = f.read().split("'")[1]

setup(
    name='vit_plugin',
    version=version,
    description='The Vision Transformer paper (Dosovitskiy et al., ICLR 2021) as an OpenMMLab plugin',
    long_description=open('README.md').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['vit_plugin', 'vit_plugin.*']),
    python_requires='>=3.9',
    install_requires=[
        'torch>=2.1',
        'torchvision>=0.16',  # mmpretrain imports it without declaring it
        'numpy',
        'mmengine>=0.10.3,<1.0',
        'mmcv>=2.0.0,<2.2.0',  # mmdet 3.3.0 refuses mmcv >= 2.2
        'mmpretrain>=1.2.0,<2.0',
        'setuptools<81',  # mmengine imports pkg_resources, removed in setuptools 81
    ],
    extras_require={
        'xla': ['torch-xla'],
        'det': ['mmdet>=3.3.0,<3.4', 'pycocotools'],
        'tests': ['pytest', 'timm>=1.0', 'scipy', 'scikit-learn', 'matplotlib'],
        'deploy': ['onnx', 'onnxruntime'],
    },
)
