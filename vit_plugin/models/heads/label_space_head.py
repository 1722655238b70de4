"""A ViT classifier head whose rows follow a named label space (docs/checkpoints.md#label-spaces)."""
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from mmengine.logging import print_log
from mmpretrain.models.heads import VisionTransformerClsHead

from vit_plugin.checkpoint.adapting import AdaptsIncomingWeights
from vit_plugin.label_spaces import canonical_name, index_map, spaces_of_size, synsets
from vit_plugin.label_spaces import num_classes as space_size
from vit_plugin.registry import MODELS

#: Where :class:`~mmpretrain.models.heads.VisionTransformerClsHead` keeps its classifier.
CLASSIFIER = 'layers.head.'


def remap_head_rows(weight: torch.Tensor, bias: Optional[torch.Tensor],
                    index) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rows of a classifier in another order: output row ``i`` is input row ``index[i]``, zero where -1.

    Returns:
        tuple: New (weight ``(num_out, C)``, bias or None), same dtype and device.

    Raises:
        ValueError: ``index`` not 1-D or out of range, or a bias of another length than the weight.
    """
    index = torch.as_tensor(np.array(index, dtype=np.int64), device=weight.device)  # a copy: maps are read-only
    if index.dim() != 1 or weight.dim() != 2:
        raise ValueError(f'remap_head_rows needs a (rows, C) weight and a 1-D index, got shapes '
                         f'{tuple(weight.shape)} and {tuple(index.shape)}')
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f'the bias has shape {tuple(bias.shape)} but the weight has {weight.shape[0]} rows')
    if len(index) and (int(index.min()) < -1 or int(index.max()) >= weight.shape[0]):
        bad = index[(index < -1) | (index >= weight.shape[0])][0]
        raise ValueError(f'index names row {int(bad)}, but the weight has rows 0..{weight.shape[0] - 1} '
                         f'(-1 marks a row without source)')
    present = index >= 0
    source = index.clamp(min=0)
    new_weight = torch.where(present[:, None], weight[source], 0)
    new_bias = None if bias is None else torch.where(present, bias[source], 0)
    return new_weight, new_bias


def _summarise(found: List[str], limit: int = 3) -> str:
    return ', '.join(found[:limit]) + (', ...' if len(found) > limit else '')


def describe_remap(src: str, dst: str) -> str:
    """How many classes of ``src`` reach ``dst``, and which ones do not (or start at zero)."""
    src, dst = canonical_name(src), canonical_name(dst)
    to_dst, from_src = index_map(src, dst), index_map(dst, src)
    dropped = [synsets(src)[i] for i in np.flatnonzero(to_dst < 0)]
    zeros = [synsets(dst)[i] for i in np.flatnonzero(from_src < 0)]
    text = f'{int((from_src >= 0).sum()):,} classes carried over'
    if dropped:
        text += f', {len(dropped):,} of {src} dropped ({_summarise(dropped)}: not in {dst})'
    if zeros:
        verb = 'starts' if len(zeros) == 1 else 'start'
        text += f', {len(zeros):,} of {dst} {verb} at zero ({_summarise(zeros)}: not in {src})'
    return text


@MODELS.register_module()
class LabelSpaceClsHead(VisionTransformerClsHead, AdaptsIncomingWeights):
    """mmpretrain's ``VisionTransformerClsHead`` with classes of a named label space.

    Heads of ``checkpoint_label_space`` are reordered to ``label_space`` on load.

    Args:
        label_space (str): The classes of this head (:mod:`vit_plugin.label_spaces`).
        in_channels (int): Width of the features.
        checkpoint_label_space (str, optional): Label space of the checkpoints to load (its size must
            differ from ``label_space``'s). Defaults to None: heads of this space only.
        num_classes (int, optional): Defaults to the size of ``label_space``; if given, it must be it.
        **kwargs: The rest of ``VisionTransformerClsHead``'s arguments.
    """

    def __init__(self,
                 label_space: str,
                 in_channels: int,
                 checkpoint_label_space: Optional[str] = None,
                 num_classes: Optional[int] = None,
                 **kwargs):
        label_space = canonical_name(label_space)
        if checkpoint_label_space is not None:
            checkpoint_label_space = canonical_name(checkpoint_label_space)
        size = space_size(label_space)
        if num_classes is not None and num_classes != size:
            raise ValueError(f'LabelSpaceClsHead: num_classes={num_classes}, but label_space={label_space!r} has '
                             f'{size} classes; drop num_classes or set it to {size}')
        if checkpoint_label_space is not None and space_size(checkpoint_label_space) == size:
            raise ValueError(f'LabelSpaceClsHead: checkpoint_label_space={checkpoint_label_space!r} has as many '
                             f'classes as label_space={label_space!r}, so a loaded head cannot tell which it is; '
                             f'convert it with tools/convert_checkpoint.py --head-label-space SRC:DST instead')
        super().__init__(num_classes=size, in_channels=in_channels, **kwargs)
        self.label_space = label_space
        self.checkpoint_label_space = checkpoint_label_space
        self.register_load_state_dict_pre_hook(self._adapt_on_load)

    def _adapt_on_load(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                       error_msgs) -> None:
        """Load-state-dict pre-hook: :meth:`adapt_incoming_weights`."""
        self.adapt_incoming_weights(state_dict, prefix)

    def adapt_incoming_weights(self, state_dict: Dict[str, torch.Tensor], prefix: str) -> List[str]:
        """Reorder the ``prefix`` classifier of ``state_dict`` in place; returns the messages logged.

        Raises:
            ValueError: A classifier of another row count than this head's or ``checkpoint_label_space``'s.
        """
        key = prefix + CLASSIFIER + 'weight'
        weight = state_dict.get(key)
        own = space_size(self.label_space)  # a space built from data may be registered by now
        if own != self.num_classes:
            raise ValueError(f'{key}: label space {self.label_space!r} now has {own} classes but this head was '
                             f'built with {self.num_classes}; build the model after the data set registered it')
        if weight is None or weight.shape[0] == own:
            return []
        rows = weight.shape[0]
        src = self.checkpoint_label_space
        if src is None or space_size(src) != rows:
            guess = [s for s in spaces_of_size(rows) if s != self.label_space]
            fix = (f"set checkpoint_label_space={guess[0]!r} in this head's config" if guess else
                   "load a checkpoint of this label space, or only its backbone (init_cfg prefix='backbone.')")
            raise ValueError(f'{key}: the checkpoint has {rows} classes, this head {own} ({self.label_space})'
                             + (f' or {space_size(src)} ({src})' if src else '') + f'; {fix}')
        bias_key = prefix + CLASSIFIER + 'bias'
        state_dict[key], new_bias = remap_head_rows(weight, state_dict.get(bias_key),
                                                    index_map(self.label_space, src))
        if new_bias is not None:
            state_dict[bias_key] = new_bias
        message = (f'Reordered the classifier "{key}" from label space {src} ({rows:,} classes) to '
                   f'{self.label_space} ({own:,}): {describe_remap(src, self.label_space)}')
        print_log(message + '.', logger='current', level=logging.INFO)
        return [message]
