#!/usr/bin/env python
"""All analysis figures of one checkpoint into one directory (the gallery in docs/evaluation.md is made with it).

``python tools/analysis/make_figures.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.make_figures`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.make_figures import main

if __name__ == '__main__':
    sys.exit(run(main))
