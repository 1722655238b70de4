from .fewshot_hook import FewShotEvalHook
from .input_norm_hook import InputNormCheckHook, use_input_norm_check
from .nonfinite_guard import NonFiniteGuardHook
from .nonfinite_reads import LossScaleCollapseError, NonFiniteTrainingError
from .pos_embed_hooks import PosEmbedResizeHook
from .rng_reseed_hook import RNGReseedHook
from .sharded_ema_hook import ShardedEMAHook, mirror_tensors
from .skip_bad_samples_hook import SkipBadSamplesHook

__all__ = ['FewShotEvalHook', 'InputNormCheckHook', 'use_input_norm_check', 'LossScaleCollapseError',
           'NonFiniteGuardHook', 'NonFiniteTrainingError', 'PosEmbedResizeHook', 'RNGReseedHook', 'ShardedEMAHook',
           'SkipBadSamplesHook', 'mirror_tensors']
