#!/usr/bin/env python
"""Mean attention distance per head versus depth over a set of images (paper Fig. 7 right).

``python tools/analysis/attention_distance.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.attention_distance`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.attention_distance import main

if __name__ == '__main__':
    sys.exit(run(main))
