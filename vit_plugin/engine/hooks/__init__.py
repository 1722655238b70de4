from .fewshot_hook import FewShotEvalHook
from .pos_embed_hooks import PosEmbedResizeHook
from .rng_reseed_hook import RNGReseedHook

__all__ = ['FewShotEvalHook', 'PosEmbedResizeHook', 'RNGReseedHook']
