"""Train a model from a config with MMEngine's runner (mmpretrain's command-line conventions).

    python tools/train.py configs/vit_l16_in21k.py [--work-dir DIR] [--resume [CKPT]] [--amp [bf16|fp16]]
        [--compile] [--auto-scale-lr] [--fsdp] [--no-validate] [--no-pin-memory] [--no-tf32]
        [--vis {tensorboard,wandb,mlflow} ...] [--cfg-options key=value ...]
        [--launcher {none,pytorch,slurm,mpi,xla}] [--dry-run [--nproc N]]

Several processes: ``bash tools/dist_train.sh CONFIG NUM_PROCS [args]`` (torchrun, DDP); on a SLURM
cluster ``bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [args]`` (srun).
TPUs: ``PJRT_DEVICE=TPU python tools/train.py CONFIG --launcher xla`` (one process per device;
``--amp`` means bf16 there); add ``--xla-spmd`` for one process per host with the batch and the
weights split over a device mesh, and ``--xla-layer-scan`` to compile one Transformer block instead
of all of them. See docs/scaling.md.
``--amp`` trains in bf16 where the device has it (vit_plugin.AutocastOptimWrapper without a loss
scaler on GPUs of compute capability 8.0 or newer, bf16 autocast on CPU, XLA autocast on TPUs) and
in fp16 with dynamic loss scaling on older GPUs; ``--amp bf16`` / ``--amp fp16`` choose. On GPUs
Adam/AdamW/SGD run fused, fp32 matmuls use TF32 and loaders pin memory (docs/configs.md).
SIGTERM / SIGUSR1 stop a run after the current iteration with a checkpoint and exit status 75
(vit_plugin.PreemptionHook), also when sent to every process of the job; run the same command with
``--resume`` to continue.

Each option only sets config keys (docs/configs.md lists them; ``--cfg-options`` sets them as well).
The run is the runner the config names: ``runner_type='vit_plugin.Runner'`` in vit_plugin's runtimes
applies the run plan (``global_batch_size``, the device defaults, pre-emption safety), whichever tool
builds it, so mmpretrain's and mmdet's own ``tools/train.py`` train such a config the same way.
``--vis tensorboard`` (also ``wandb``, ``mlflow``, several at once) writes the scalars to that dashboard
as well (docs/monitoring.md). ``--dry-run`` prints that plan and each change it makes to the config
(``--nproc N``: for N processes), then exits without building a model or loading data.

The code is :mod:`vit_plugin.cli.train`, over one function per option in :mod:`vit_plugin.cli.launch`.
"""
from vit_plugin.cli.launch import run_as_script
from vit_plugin.cli.train import main

if __name__ == '__main__':
    run_as_script(main)
