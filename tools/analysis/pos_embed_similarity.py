#!/usr/bin/env python
"""Position-embedding similarity of a ViT checkpoint: each patch's cosine similarity to all others (Fig. 7 centre).

``python tools/analysis/pos_embed_similarity.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.pos_embed_similarity`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.pos_embed_similarity import main

if __name__ == '__main__':
    sys.exit(run(main))
