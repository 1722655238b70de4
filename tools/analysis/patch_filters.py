#!/usr/bin/env python
"""Patch-embedding filters of a ViT checkpoint: top principal components as RGB tiles (paper Fig. 7 left).

``python tools/analysis/patch_filters.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.patch_filters`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.patch_filters import main

if __name__ == '__main__':
    sys.exit(run(main))
