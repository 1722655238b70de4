#!/usr/bin/env python
"""Parameters and FLOPs of the paper's ViT models per patch size and resolution, next to its Table 1.

``python tools/analysis/model_summary.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.model_summary`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.model_summary import main

if __name__ == '__main__':
    sys.exit(run(main))
