"""Train a model from a config with MMEngine's runner (mmpretrain's command-line conventions).

    python tools/train.py configs/vit_l16_in21k.py [--work-dir DIR] [--resume [CKPT]] [--amp [bf16|fp16]]
        [--auto-scale-lr] [--fsdp] [--no-validate] [--cfg-options key=value ...]
        [--launcher {none,pytorch,slurm,mpi,xla}]

Several processes: ``bash tools/dist_train.sh CONFIG NUM_PROCS [args]`` (torchrun, DDP).
TPUs: ``PJRT_DEVICE=TPU python tools/train.py CONFIG --launcher xla`` (one process per device;
``--amp`` means bf16 there); add ``--xla-spmd`` for one process per host with the batch and the
weights split over a device mesh, and ``--xla-layer-scan`` to compile one Transformer block instead
of all of them. See docs/scaling.md.
``--amp bf16`` trains in bf16 on any device: mmengine's AmpOptimWrapper on GPUs, bf16 autocast on
CPU (vit_plugin.CPUAmpOptimWrapper), XLA autocast on TPUs.
SIGTERM / SIGUSR1 stop a run after the current iteration with a checkpoint and exit status 75
(vit_plugin.PreemptionHook); run the same command with ``--resume`` to continue.

The code is :mod:`vit_plugin.apis.train`, over one function per concern in :mod:`vit_plugin.apis.launch`.
"""
from vit_plugin.apis.train import main

if __name__ == '__main__':
    main()
