#!/usr/bin/env python
"""The released models by name, with their parameters counted: the table of docs/model_zoo.md.

``python tools/analysis/model_zoo.py --help`` lists the options; the code is :mod:`vit_plugin.cli.model_zoo`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.model_zoo import main

if __name__ == '__main__':
    sys.exit(run(main))
