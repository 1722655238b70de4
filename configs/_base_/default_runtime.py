# Runtime shared by every classification / pre-training config of vit_plugin.
#
# Scope convention (see README "Using vit_plugin from your own configs"): keep mmpretrain as the
# default scope so that unprefixed names (ImageClassifier, VisionTransformerClsHead, transforms,
# Accuracy, hooks) resolve in mmpretrain/mmengine, and name our components `vit_plugin.X`.
default_scope = 'mmpretrain'
custom_imports = dict(imports=['vit_plugin'], allow_failed_imports=False)

# The runner every entry point builds (our tools/train.py, mmpretrain's and mmdet's tools/train.py,
# RUNNERS.build(cfg) in a script): mmengine's Runner, after it has applied, once the number of processes
# is known, the steps below (docs/configs.md#one-runner-named-by-the-config). `--fsdp` switches to
# 'vit_plugin.FlexibleRunner' with a `strategy`.
runner_type = 'vit_plugin.Runner'
# global_batch_size (set by the schedules): gradient accumulation, iteration counts rescaled.
# Fused optimizers, TF32 and pinned memory on GPUs; Gloo for multi-process runs without GPUs.
device_defaults = True
# default_hooks.preemption and atomic checkpoints where a config names mmengine's CheckpointHook;
# `resume=True` without load_from resumes from the newest intact checkpoint of the work dir.
preemption = True
# default_hooks.input_norm_check where a config has none.
input_norm_check = True

# Only hooks whose checkpoint state is plain tensors/numbers: every runner checkpoint written with
# these resumes through vit_plugin's weights-only loader (no code-executing unpickling needed).
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    # Validation metrics logged at the iteration, the step of every training scalar (mmengine's default
    # is the epoch: 0 for an IterBasedTrainLoop), so a dashboard draws all of them on one axis.
    logger=dict(type='LoggerHook', interval=100, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # Most of our schedules count optimizer steps (IterBasedTrainLoop); configs change the interval.
    # Atomic files (never half-written) and a last_checkpoint relative to the work dir.
    checkpoint=dict(type='vit_plugin.AtomicCheckpointHook', by_epoch=False, interval=10000, max_keep_ckpts=3),
    # SIGTERM / SIGUSR1: finish the iteration, save its checkpoint, exit with status 75 (then --resume).
    preemption=dict(type='vit_plugin.PreemptionHook'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='VisualizationHook', enable=False),
    # Random streams derived from (seed, rank, step): `--resume` repeats the uninterrupted run
    # exactly, and each data-parallel process draws its own dropout / drop-path / MPP masks.
    rng_reseed=dict(type='vit_plugin.RNGReseedHook'),
    # Adapts position embeddings inside checkpoints read by load_from/--resume (and resets the
    # optimizer state of resized tensors), so a run can resume at another resolution.
    pos_embed_resize=dict(type='vit_plugin.PosEmbedResizeHook'),
    # Drops updates whose loss or gradient norm is NaN/inf before they touch the weights or the
    # optimizer state; stops the run after max_consecutive in a row (resume with --resume).
    nonfinite_guard=dict(type='vit_plugin.NonFiniteGuardHook', max_consecutive=10),
    # Inert unless the training dataset is wrapped in vit_plugin.SkipBadSamples (the skip policy, off by
    # default): then it logs every skipped file, reports the counts, stops past the limit.
    bad_samples=dict(type='vit_plugin.SkipBadSamplesHook'),
    # Warns when loaded weights were trained on inputs scaled otherwise than data_preprocessor scales them.
    input_norm_check=dict(type='vit_plugin.InputNormCheckHook'),
    # Reports a run mmengine's Runner.from_cfg built without the run plan (it ignores runner_type), and stops
    # it when its global_batch_size was thereby dropped.
    runner_check=dict(type='vit_plugin.RunnerCheckHook'),
)

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    # vit_plugin.Runner switches to 'gloo' when no GPU is visible (CPU-only DDP).
    dist_cfg=dict(backend='nccl'),
)

# scalars.json in <work_dir>/<timestamp>/vis_data; `tools/train.py --vis tensorboard|wandb|mlflow` adds mmengine's
# TensorboardVisBackend, WandbVisBackend, MLflowVisBackend to visualizer.vis_backends (docs/monitoring.md).
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='UniversalVisualizer', vis_backends=vis_backends)

log_level = 'INFO'
load_from = None
resume = False
# Reproducible by default; set deterministic=True as well for bit-exact CPU re-runs (slower on GPU).
# diff_rank_seed stays off: the processes start from the same weights and shuffle with the same
# sampler seed, and RNGReseedHook already gives each process its own stream for every step.
randomness = dict(seed=0, deterministic=False)
