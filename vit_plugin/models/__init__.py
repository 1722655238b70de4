from .backbones import *  # noqa: F401,F403
from .heads import *  # noqa: F401,F403
from .necks import *  # noqa: F401,F403
from .input_norm import check_input_normalization
from .patch_resize import resize_patch_embed
from .pos_embed import RESIZE_MODES, infer_grid, resize_pos_embed
from .selfsup import *  # noqa: F401,F403

__all__ = ['RESIZE_MODES', 'check_input_normalization', 'infer_grid', 'resize_patch_embed', 'resize_pos_embed']
