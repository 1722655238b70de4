"""Turn a sharded checkpoint (the ``iter_N.pth/`` directories of ``tools/train.py --fsdp``) into one

``python tools/consolidate_checkpoint.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.consolidate_checkpoint`.
"""
from vit_plugin.cli.consolidate_checkpoint import main

if __name__ == '__main__':
    main()
