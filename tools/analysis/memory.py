#!/usr/bin/env python
"""Plan training memory: weights, gradients, optimizer state, activations, the largest batch that fits.

``python tools/analysis/memory.py --help`` lists the options; the code is
:mod:`vit_plugin.apis.analysis.memory`.
"""
import sys

from vit_plugin.analysis.cli import run
from vit_plugin.apis.analysis.memory import main

if __name__ == '__main__':
    sys.exit(run(main))
