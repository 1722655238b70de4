# Runtime shared by every classification / pre-training config of vit_plugin.
#
# Scope convention (see README "Using vit_plugin from your own configs"): keep mmpretrain as the
# default scope so that unprefixed names (ImageClassifier, VisionTransformerClsHead, transforms,
# Accuracy, hooks) resolve in mmpretrain/mmengine, and name our components `vit_plugin.X`.
default_scope = 'mmpretrain'
custom_imports = dict(imports=['vit_plugin'], allow_failed_imports=False)

# Only hooks whose checkpoint state is plain tensors/numbers: every runner checkpoint written with
# these resumes through vit_plugin's weights-only loader (no code-executing unpickling needed).
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # Most of our schedules count optimizer steps (IterBasedTrainLoop); configs change the interval.
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=10000, max_keep_ckpts=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='VisualizationHook', enable=False),
    # Random streams derived from (seed, step): `--resume` repeats the uninterrupted run exactly.
    rng_reseed=dict(type='vit_plugin.RNGReseedHook'),
    # Adapts position embeddings inside checkpoints read by load_from/--resume (and resets the
    # optimizer state of resized tensors), so a run can resume at another resolution.
    pos_embed_resize=dict(type='vit_plugin.PosEmbedResizeHook'),
)

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    # tools/train.py switches to 'gloo' when no GPU is visible (CPU-only DDP).
    dist_cfg=dict(backend='nccl'),
)

vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='UniversalVisualizer', vis_backends=vis_backends)

log_level = 'INFO'
load_from = None
resume = False
# Reproducible by default; set deterministic=True as well for bit-exact CPU re-runs (slower on GPU).
randomness = dict(seed=0, deterministic=False)
