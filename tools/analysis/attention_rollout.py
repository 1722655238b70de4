#!/usr/bin/env python
"""Attention rollout from the output token to the input, overlaid on images (paper Fig. 6).

``python tools/analysis/attention_rollout.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.attention_rollout`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.attention_rollout import main

if __name__ == '__main__':
    sys.exit(run(main))
