#!/usr/bin/env python
"""Convert a ViT checkpoint (official JAX .npz, timm, mmpretrain) into a vit_plugin .pth (or export

``python tools/convert_checkpoint.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.convert_checkpoint`.
"""
import sys

from vit_plugin.cli.convert_checkpoint import main

if __name__ == '__main__':
    sys.exit(main())
