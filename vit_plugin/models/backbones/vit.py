"""The Vision Transformer backbone of Dosovitskiy et al., ICLR 2021."""
import math
import warnings
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from vit_plugin.registry import MODELS
from ..layers import EncoderBlock, PatchEmbed, lecun_normal_, pad_to_patch_multiple
from ..load_adapt import adapt_vit_state_dict
from ..numerics import (CHECKPOINT_NUMERICS, apply_checkpoint_numerics, parse_input_norm, record_gelu,
                        record_input_norm, record_norm_eps)
from ..pos_embed import CHECKPOINT_RESIZE_MODE, RESIZE_MODES, resize_pos_embed
from ..rel_pos import REL_POS_PARAM_SUFFIXES
from .vit_arch import VIT_ARCHS, parse_arch
from .vit_options import OUT_TYPES, PatchSettings, block_settings, patch_settings, resolve_norm_eps


def global_block_indices(num_layers: int) -> Tuple[int, ...]:
    """Sorted 0-based indices of the blocks a windowed ViT keeps global, ViTDet's rule (docs/backbone.md)."""
    return tuple(sorted({(k * num_layers + 3) // 4 - 1 for k in range(1, 5)}))  # ceil(k L / 4) - 1


#: How a ViT may run its blocks instead of its Python loop (:meth:`ViT.set_block_runner`):
#: ``runner(blocks, tokens, grid) -> tokens after the last block``.
BlockRunner = Callable[[nn.ModuleList, torch.Tensor, Tuple[int, int]], torch.Tensor]


class BlockOutputs(NamedTuple):
    """:meth:`ViT.forward_blocks`'s result: ``last`` tokens (before the final norm), ``taps``, ``attention``."""
    last: torch.Tensor
    taps: List[torch.Tensor]
    attention: List[torch.Tensor]


@MODELS.register_module()
class ViT(BaseModule):
    """Vision Transformer (`An Image is Worth 16x16 Words <https://arxiv.org/abs/2010.11929>`_).

    A drop-in for mmpretrain's ``VisionTransformer`` (keywords, checkpoints). Options and output shapes:
    docs/backbone.md; loading and numerics records: docs/checkpoints.md#every-loading-path.

    Args:
        arch (str | dict): A key of :attr:`arch_zoo` or a dict of ``embed_dims``, ``num_layers``,
            ``num_heads``, ``mlp_dims`` (or ``feedforward_channels``). Defaults to 'base'.
        img_size, patch_size (int | tuple[int, int]): In pixels; ``img_size`` fixes the position grid.
        out_type (str): 'cls_token' (B, D), 'gap' (B, D), 'avg_featmap' (B, D), 'featmap'
            (B, D, h, w) or 'raw' (B, N, D). Defaults to 'cls_token'.
        out_indices (int | Sequence[int]): Blocks whose outputs are returned; the final norm applies to
            the last block only. Defaults to -1.
        drop_rate, attn_drop_rate, drop_path_rate (float): Dropout, attention dropout, stochastic depth.
        norm_eps (float, optional): LayerNorm eps. None: 1e-6, or the ``eps`` of ``norm_cfg``.
        gelu_approximate (str): 'none' (exact) or 'tanh' (the official Flax GELU).
        expected_input_norm (dict, optional): ``dict(mean, std)`` the weights expect, 0..255 units.
        checkpoint_numerics (str): 'from_checkpoint', 'keep' or 'error' for a checkpoint's records.
        interpolate_mode, pos_embed_load_mode (str): Position-table resize for inputs / checkpoints.
        pad_to_patch (bool): Zero-pad inputs the patch does not divide instead of raising.
        frozen_stages (int): Freeze the embeddings and the first ``frozen_stages`` blocks.
        with_cp (bool): Activation checkpointing per block (:meth:`set_grad_checkpointing`).
        window_size, window_block_indices: ViTDet's windowed attention (:func:`global_block_indices`).
        use_rel_pos (bool): ViTDet's decomposed relative position bias (docs/detection.md).
        in_channels, with_cls_token, qkv_bias, final_norm, init_cfg: As named (:meth:`init_weights`).
        pre_norm, norm_cfg, layer_scale_init_value, patch_cfg, layer_cfgs: mmpretrain's, with its meaning.

    Raises:
        ValueError: An option value without meaning here, named with what to use instead.
    """
    arch_zoo: Dict[str, dict] = VIT_ARCHS

    def __init__(self,
                 arch: Union[str, dict] = 'base',
                 img_size: Union[int, Sequence[int]] = 224,
                 patch_size: Union[int, Sequence[int]] = 16,
                 in_channels: int = 3,
                 out_type: str = 'cls_token',
                 out_indices: Union[int, Sequence[int]] = -1,
                 with_cls_token: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 qkv_bias: bool = True,
                 norm_eps: Optional[float] = None,
                 gelu_approximate: str = 'none',
                 expected_input_norm: Optional[dict] = None,
                 checkpoint_numerics: str = 'from_checkpoint',
                 final_norm: bool = True,
                 interpolate_mode: str = 'bicubic',
                 pos_embed_load_mode: str = CHECKPOINT_RESIZE_MODE,
                 pad_to_patch: bool = False,
                 frozen_stages: int = -1,
                 with_cp: bool = False,
                 window_size: int = 0,
                 window_block_indices: Optional[Sequence[int]] = None,
                 use_rel_pos: bool = False,
                 pre_norm: bool = False,
                 norm_cfg: Optional[dict] = None,
                 layer_scale_init_value: float = 0.,
                 patch_cfg: Optional[dict] = None,
                 layer_cfgs: Union[None, dict, Sequence[dict]] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None):
        super().__init__(init_cfg=init_cfg)
        self.arch_settings = parse_arch(arch, self.arch_zoo)
        self.embed_dims = self.arch_settings['embed_dims']
        self.num_layers = self.arch_settings['num_layers']
        _check_choices(out_type, with_cls_token, interpolate_mode, pos_embed_load_mode, gelu_approximate,
                       checkpoint_numerics)
        norm_eps = resolve_norm_eps(norm_eps, norm_cfg)
        patch = patch_settings(patch_cfg, patch_size, img_size, in_channels, self.embed_dims, pad_to_patch, pre_norm)
        self.img_size = patch.img_size
        self.patch_size = patch.patch_size
        self.patch_padding = patch.padding  # None: sizes the patch does not divide are refused
        self.pad_to_patch = patch.padding is not None
        self.out_type = out_type
        self.with_cls_token = with_cls_token
        self.num_prefix_tokens = int(with_cls_token)
        self.interpolate_mode = interpolate_mode
        self.pos_embed_load_mode = pos_embed_load_mode
        self.final_norm = final_norm
        self.frozen_stages = frozen_stages
        self.checkpoint_numerics = checkpoint_numerics

        self._build_embedding(patch, drop_rate, pre_norm, norm_eps)
        self.window_size = window_size
        self.window_block_indices = self._parse_window_blocks(window_size, window_block_indices)
        self.use_rel_pos = use_rel_pos
        block_defaults = dict(qkv_bias=qkv_bias, drop=drop_rate, attn_drop=attn_drop_rate, norm_eps=norm_eps,
                              gelu_approximate=gelu_approximate,
                              layer_scale_init_value=float(layer_scale_init_value), ffn_type='origin',
                              activation='gelu')
        self._build_blocks(block_settings(layer_cfgs, self.arch_settings, block_defaults, drop_path_rate))
        self._build_output_norms(norm_eps)
        self.out_indices = self._parse_out_indices(out_indices)
        self.set_grad_checkpointing(with_cp)
        self.block_runner: Optional[BlockRunner] = None  # the Python loop; see set_block_runner
        self._register_state_hooks(parse_input_norm(expected_input_norm))
        self._freeze_stages()

    # ------------------------------------------------------------------ construction steps
    def _build_embedding(self, patch: PatchSettings, drop_rate: float, pre_norm: bool, norm_eps: float) -> None:
        self.patch_embed = self._build_patch_embed(patch)
        grid = self._grid_for(self.img_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims)) if self.with_cls_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + grid[0] * grid[1], self.embed_dims))
        # The grid the table is laid out on travels with the weights, so that whatever path loads
        # them later (init_cfg, load_from, resume, plain load_state_dict, another model) can resize a
        # non-square table without guessing.
        self.register_buffer('pos_embed_grid', torch.tensor(grid, dtype=torch.long), persistent=True)
        self._patch_grid = grid  # the same, as Python ints: no device read in forward (XLA-friendly)
        self.drop_after_pos = nn.Dropout(drop_rate)
        # mmpretrain's pre_norm (CLIP): a LayerNorm on the embedded tokens; timm's name for it.
        self.norm_pre = nn.LayerNorm(self.embed_dims, eps=norm_eps) if pre_norm else nn.Identity()

    def _build_blocks(self, settings: List[dict]) -> None:
        rel_pos_grid = self.patch_grid if self.use_rel_pos else None
        self.blocks = nn.ModuleList([
            EncoderBlock(self.embed_dims, self.arch_settings['num_heads'], self.arch_settings['mlp_dims'],
                         window_size=self.window_size if i in self.window_block_indices else 0,
                         num_prefix_tokens=self.num_prefix_tokens, rel_pos_grid=rel_pos_grid, **block)
            for i, block in enumerate(settings)
        ])

    def _build_output_norms(self, norm_eps: float) -> None:
        """The final LayerNorm, and ``fc_norm`` of ``out_type='avg_featmap'`` (mmpretrain's ``ln2``)."""
        self.norm = nn.LayerNorm(self.embed_dims, eps=norm_eps) if self.final_norm else nn.Identity()
        self.fc_norm = nn.LayerNorm(self.embed_dims, eps=norm_eps) if self.out_type == 'avg_featmap' else nn.Identity()

    def _register_state_hooks(self, expected_input_norm) -> None:
        """Load: adapt the layout, then apply the numerics records; save: write the records."""
        self.register_load_state_dict_pre_hook(self._adapt_checkpoint_layout_on_load)
        self.register_load_state_dict_pre_hook(self._apply_checkpoint_numerics_on_load)
        self.register_state_dict_post_hook(record_gelu)  # weights trained with tanh GELU say so
        # The LayerNorm epsilon a checkpoint recorded (e.g. 1e-12 of transformers ports), saved again.
        self.recorded_norm_eps: Optional[float] = None
        self.register_state_dict_post_hook(record_norm_eps)
        # The input normalisation the weights expect ((mean, std) in 0..255 units), declared by the
        # config or recorded by a checkpoint; saved with the weights again.
        self.expected_input_norm = expected_input_norm
        self.register_state_dict_post_hook(record_input_norm)

    def _parse_out_indices(self, out_indices):
        if isinstance(out_indices, int):
            out_indices = [out_indices]
        if not isinstance(out_indices, Sequence) or isinstance(out_indices, str):
            raise TypeError(f'out_indices must be an int or a sequence of ints, got {type(out_indices).__name__}')
        parsed = []
        for index in out_indices:
            real = index + self.num_layers if index < 0 else index
            if not 0 <= real < self.num_layers:
                raise ValueError(f'out index {index} is out of range for {self.num_layers} blocks')
            parsed.append(real)
        return sorted(set(parsed))

    def _parse_window_blocks(self, window_size, indices):
        if window_size < 0:
            raise ValueError(f'window_size must be >= 0 (0 = global attention everywhere), got {window_size}')
        if not window_size:
            return ()
        if indices is None:
            global_blocks = global_block_indices(self.num_layers)
            parsed = tuple(i for i in range(self.num_layers) if i not in global_blocks)
        else:
            parsed = tuple(sorted({i + self.num_layers if i < 0 else i for i in indices}))
            if any(not 0 <= i < self.num_layers for i in parsed):
                raise ValueError(f'window_block_indices {list(indices)} out of range for {self.num_layers} blocks')
        if not parsed:
            how = ('window_block_indices is empty' if indices is not None else
                   f'the default rule keeps all {self.num_layers} blocks global (the last block of each of '
                   f'4 stages; a model needs more than 4 blocks for any to be windowed)')
            warnings.warn(f'window_size={window_size} windows no block: {how}. Pass window_block_indices '
                          f'to choose windowed blocks, or window_size=0 for global attention everywhere.',
                          stacklevel=3)
        return parsed

    def _build_patch_embed(self, patch: PatchSettings) -> nn.Module:
        """The module turning images into (tokens, grid); the hybrid replaces it."""
        return PatchEmbed(self.patch_size, patch.in_channels, self.embed_dims, bias=patch.bias)

    def _patches_along(self, size: int, patch: int) -> int:
        return -(-size // patch) if self.patch_padding else size // patch

    def _grid_for(self, img_size: Tuple[int, int]) -> Tuple[int, int]:
        return (self._patches_along(img_size[0], self.patch_size[0]),
                self._patches_along(img_size[1], self.patch_size[1]))

    @property
    def patch_grid(self) -> Tuple[int, int]:
        """The (rows, cols) grid the stored position embedding is laid out on."""
        return self._patch_grid

    def set_grad_checkpointing(self, enable: bool = True):
        """Turn activation checkpointing of every block on or off (timm's switch; block runners read it)."""
        self.with_cp = enable
        for block in self.blocks:
            block.with_cp = enable

    def set_block_runner(self, runner: Optional[BlockRunner]) -> None:
        """Run :meth:`forward_blocks`'s last-block-only passes with ``runner(blocks, tokens, grid)``, or None.

        Raises:
            TypeError: ``runner`` is neither callable nor None.
        """
        if runner is not None and not callable(runner):
            raise TypeError(f'set_block_runner takes a callable (blocks, tokens, grid) -> tokens or None, got '
                            f'{type(runner).__name__}')
        self.block_runner = runner

    # ------------------------------------------------------------------ initialisation
    def init_weights(self):
        """The official initialisation, or ``init_cfg`` when given (docs/backbone.md#initialisation)."""
        if self.init_cfg is not None:
            super().init_weights()
            if not _loads_weights(self.init_cfg):
                # An init_cfg that initialises layers (mmpretrain's configs: Kaiming for the patch
                # projection) says nothing about the position table; it must not stay zero (mmpretrain
                # draws it from the same normal).
                nn.init.normal_(self.pos_embed, std=0.02)
            return
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                if name.endswith('attn.qkv'):
                    bound = math.sqrt(6. / (module.in_features + module.out_features // 3))
                    nn.init.uniform_(module.weight, -bound, bound)
                else:
                    nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.normal_(module.bias, std=1e-6)
        lecun_normal_(self.patch_embed.proj.weight)
        nn.init.zeros_(self.patch_embed.proj.bias)
        nn.init.normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        for name, param in self.named_parameters():
            if name.endswith(REL_POS_PARAM_SUFFIXES):
                nn.init.zeros_(param)

    # ------------------------------------------------------------------ loading
    def _adapt_checkpoint_layout_on_load(self, module, state_dict, prefix, local_metadata, strict, missing_keys,
                                         unexpected_keys, error_msgs):
        """Load pre-hook: key names, position table, patch kernel (:func:`adapt_vit_state_dict`)."""
        adapt_vit_state_dict(self, state_dict, prefix)

    #: The name of the layout step in earlier releases.
    _resize_pos_embed_on_load = _adapt_checkpoint_layout_on_load

    def _apply_checkpoint_numerics_on_load(self, module, state_dict, prefix, local_metadata, strict,
                                           missing_keys, unexpected_keys, error_msgs):
        """Load pre-hook: the numerics records, as ``checkpoint_numerics`` says."""
        apply_checkpoint_numerics(self, state_dict, prefix)

    # ------------------------------------------------------------------ freezing
    def _freeze_stages(self):
        if self.frozen_stages <= 0:
            return
        frozen = [self.patch_embed, self.drop_after_pos, self.norm_pre, *self.blocks[:self.frozen_stages]]
        if self.frozen_stages >= self.num_layers:
            frozen += [self.norm, self.fc_norm]
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        self.pos_embed.requires_grad = False
        if self.cls_token is not None:
            self.cls_token.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        return self

    # ------------------------------------------------------------------ layer-wise lr decay / wd
    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """(depth, ``num_layers + 2``) for layer-wise lr decay: embeddings 0, block ``i`` ``i + 1``, rest last."""
        num_depths = self.num_layers + 2
        if not param_name.startswith(prefix):
            return num_depths - 1, num_depths
        name = param_name[len(prefix):]
        if name in ('cls_token', 'pos_embed', 'pos_embed_grid') or name.startswith(('patch_embed', 'norm_pre')):
            return 0, num_depths
        if name.startswith('blocks.'):
            return int(name.split('.')[1]) + 1, num_depths
        return num_depths - 1, num_depths

    def no_weight_decay(self) -> set:
        """Names of the parameters without weight decay: position tables and the class token."""
        names = {'pos_embed', 'cls_token'}
        if self.use_rel_pos:
            names |= {name for name, _ in self.named_parameters() if name.endswith(REL_POS_PARAM_SUFFIXES)}
        return names

    # ------------------------------------------------------------------ forward
    def _pad_or_check(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ph, pw = self.patch_size
        if h % ph == 0 and w % pw == 0:
            return x
        if self.patch_padding is None:
            raise ValueError(f'input size {h}x{w} is not divisible by the patch size {ph}x{pw}; resize or '
                             f'crop the input to a multiple of the patch size, or build the backbone with '
                             f'pad_to_patch=True to zero-pad the bottom and right edges (mmpretrain\'s '
                             f"behaviour; patch_cfg=dict(padding='corner') says the same)")
        return pad_to_patch_multiple(x, self.patch_size, self.patch_padding)

    def _pos_embed_for(self, grid: Tuple[int, int]) -> torch.Tensor:
        if grid == self.patch_grid:
            return self.pos_embed
        return resize_pos_embed(self.pos_embed, grid, self.patch_grid, self.num_prefix_tokens,
                                mode=self.interpolate_mode)

    def embed(self, x: torch.Tensor,
              patch_transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
              ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Images (B, C, H, W) -> (tokens (B, N, D), grid); ``patch_transform`` edits patch embeddings first.

        Raises:
            ValueError: The patch does not divide the input size and ``pad_to_patch`` is off.
        """
        x, grid = self.patch_embed(self._pad_or_check(x))
        if patch_transform is not None:
            x = patch_transform(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.norm_pre(self.drop_after_pos(x + self._pos_embed_for(grid))), grid

    def forward_blocks(self, x: torch.Tensor, grid: Tuple[int, int], taps: Sequence[int] = (),
                       return_attention: bool = False) -> BlockOutputs:
        """Embedded tokens (B, N, D) through every block -> :class:`BlockOutputs` (``taps``: 0-based blocks)."""
        if self.block_runner is not None and not taps and not return_attention:
            return BlockOutputs(self.block_runner(self.blocks, x, grid), [], [])
        tapped, attention = [], []
        for i, block in enumerate(self.blocks):
            if return_attention:
                x, weights = block(x, return_attention=True, grid=grid)
                attention.append(weights)
            else:
                x = block(x, grid=grid)
            if i in taps:
                tapped.append(x)
        return BlockOutputs(x, tapped, attention)

    def forward_tokens(self, x: torch.Tensor, grid: Tuple[int, int]) -> Tuple[torch.Tensor, ...]:
        """Embedded tokens -> one formatted output per ``out_indices`` entry."""
        last = self.num_layers - 1
        blocks = self.forward_blocks(x, grid, taps=[i for i in self.out_indices if i != last])
        outs = [self._format_output(tokens, grid) for tokens in blocks.taps]
        if last in self.out_indices:
            outs.append(self._format_output(self.norm(blocks.last), grid))
        return tuple(outs)

    def _format_output(self, tokens: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        if self.out_type == 'raw':
            return tokens
        if self.out_type == 'cls_token':
            return tokens[:, 0]
        patches = tokens[:, self.num_prefix_tokens:]
        if self.out_type == 'gap':
            return patches.mean(dim=1)
        if self.out_type == 'avg_featmap':
            return self.fc_norm(patches.mean(dim=1))
        B, _, D = patches.shape
        return patches.transpose(1, 2).reshape(B, D, grid[0], grid[1])

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Images (B, C, H, W) -> a tuple with one output per ``out_indices`` entry."""
        x, grid = self.embed(x)
        return self.forward_tokens(x, grid)

    def encode(self, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """Embedded tokens (B, N, D) and grid -> all tokens after every block and the final norm."""
        return self.norm(self.forward_blocks(x, grid).last)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> all tokens (B, N, D) after the last block and the final norm."""
        return self.encode(*self.embed(x))

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Attention weights of every block, each (B, heads, N, N)."""
        return self.forward_blocks(*self.embed(x), return_attention=True).attention


def _check_choices(out_type: str, with_cls_token: bool, interpolate_mode: str, pos_embed_load_mode: str,
                   gelu_approximate: str, checkpoint_numerics: str) -> None:
    if out_type not in OUT_TYPES:
        raise ValueError(f'out_type must be one of {OUT_TYPES}, got {out_type!r}')
    if out_type == 'cls_token' and not with_cls_token:
        raise ValueError("out_type='cls_token' needs with_cls_token=True; use 'gap' (or mmpretrain's 'avg_featmap') "
                         'for a model without class token')
    for name, mode in (('interpolate_mode', interpolate_mode), ('pos_embed_load_mode', pos_embed_load_mode)):
        if mode not in RESIZE_MODES:
            raise ValueError(f'{name} must be one of {RESIZE_MODES}, got {mode!r}')
    if gelu_approximate not in ('none', 'tanh'):
        raise ValueError(f"gelu_approximate must be 'none' or 'tanh', got {gelu_approximate!r}")
    if checkpoint_numerics not in CHECKPOINT_NUMERICS:
        raise ValueError(f'checkpoint_numerics must be one of {CHECKPOINT_NUMERICS}, got {checkpoint_numerics!r}')


def _loads_weights(init_cfg: Union[dict, List[dict]]) -> bool:
    cfgs = init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]
    return any(isinstance(cfg, dict) and cfg.get('type') == 'Pretrained' for cfg in cfgs)
