"""Evaluate a checkpoint on a config's test set (mmpretrain's command-line conventions).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out metrics.json]
        [--cfg-options key=value ...] [--launcher {none,pytorch,slurm,mpi}]
    python tools/test.py MODEL_NAME [CHECKPOINT] [...]   # a released model (docs/model_zoo.md)

Several processes: ``bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [args]``. When the config
has an ``EMAHook`` and the checkpoint holds an EMA state, the averaged weights are evaluated.

The code is :mod:`vit_plugin.cli.test`, over the functions of :mod:`vit_plugin.cli.launch`.
"""
from vit_plugin.cli.launch import run_as_script
from vit_plugin.cli.test import main

if __name__ == '__main__':
    run_as_script(main)
