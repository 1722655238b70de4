"""What every converter shares: the report of what happened to each key, and its checks."""
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import torch

#: Where our converters put things in a whole-classifier state dict: mmpretrain's ``ImageClassifier``
#: with our backbone and mmpretrain's ``VisionTransformerClsHead`` (``head.layers.pre_logits`` +
#: ``head.layers.head``), the layout ``load_from`` and ``init_cfg=dict(..., prefix='backbone.')`` use.
BACKBONE_PREFIX = 'backbone.'
HEAD_PREFIX = 'head.layers.'


class ConversionError(ValueError):
    """A checkpoint cannot be converted as asked; the message names the keys and the fix."""


@dataclass
class ConversionReport:
    """What a conversion did with each key.

    Attributes:
        source (str): Description of the input, used in messages.
        loaded, resized, dropped: Destination keys written; tensors whose shape changed; keys left out.
        missing, unknown: Keys a complete model needs that the source lacks; keys not understood.
        notes (list[str]): Facts that change how converted weights behave in our model.
    """
    source: str = 'checkpoint'
    loaded: List[str] = field(default_factory=list)
    resized: List[str] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unknown: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def summary(self) -> str:
        """Multi-line human-readable summary (counts, then the keys of every non-empty category)."""
        lines = [f'{self.source}: loaded {len(self.loaded)}, resized {len(self.resized)}, dropped '
                 f'{len(self.dropped)}, missing {len(self.missing)}, unknown {len(self.unknown)} keys']
        for name in ('resized', 'dropped', 'missing', 'unknown'):
            for item in getattr(self, name):
                lines.append(f'  {name}: {item}')
        lines += [f'  note: {item}' for item in self.notes]
        return '\n'.join(lines)

    def check(self, allow_unknown: bool = False, allow_missing: bool = False, hint: str = '') -> None:
        """Raise :class:`ConversionError` on unknown or missing keys unless allowed, ``hint`` appended."""
        problems = []
        if self.unknown and not allow_unknown:
            problems.append(f'{len(self.unknown)} unknown key(s) {_head(self.unknown)}: the file holds weights '
                            f'this converter does not map (another model family or a newer variant). If you '
                            f'are sure they can be ignored, pass --allow-unknown (allow_unknown=True)')
        if self.missing and not allow_missing:
            problems.append(f'{len(self.missing)} missing key(s) {_head(self.missing)}: the file lacks weights a '
                            f'complete model needs (a truncated export or another model family). To load it '
                            f'anyway and keep those weights at their initial values, pass --allow-missing '
                            f'(allow_missing=True)')
        if problems:
            raise ConversionError(f'cannot convert {self.source}: ' + '; '.join(problems) + '.'
                                  + (f' {hint}' if hint else ''))


def _head(keys: List[str], n: int = 5) -> str:
    shown = ', '.join(repr(k) for k in keys[:n])
    return f'[{shown}{", ..." if len(keys) > n else ""}]'


def unwrap_state_dict(checkpoint, source: str = 'checkpoint') -> Dict[str, torch.Tensor]:
    """The tensor dict inside a checkpoint: ``state_dict``/``model``/``module`` entries or the dict itself."""
    if not isinstance(checkpoint, dict):
        raise ConversionError(f'{source}: expected a dict of tensors or a checkpoint dict, got '
                              f'{type(checkpoint).__name__}')
    for key in ('state_dict', 'model', 'module'):
        if isinstance(checkpoint.get(key), dict):
            return checkpoint[key]
    return checkpoint


def strip_prefix(state_dict: Dict[str, torch.Tensor], prefixes: Iterable[str]) -> Dict[str, torch.Tensor]:
    """Remove the first of ``prefixes`` that every key starts with (e.g. DDP's 'module.')."""
    for prefix in prefixes:
        if state_dict and all(k.startswith(prefix) for k in state_dict):
            return {k[len(prefix):]: v for k, v in state_dict.items()}
    return dict(state_dict)


#: Files larger than this get a progress bar (reading a ViT-H .npz takes a while; small files don't).
PROGRESS_MIN_BYTES = 64 * 2**20


def progress(items: List, enabled: bool, description: str):
    """Iterate ``items``, drawing a progress bar on stderr when ``enabled``."""
    if not enabled:
        yield from items
        return
    import sys

    from mmengine.utils import ProgressBar
    print(description, file=sys.stderr)
    bar = ProgressBar(len(items), file=sys.stderr)
    for item in items:
        yield item
        bar.update()
    sys.stderr.write('\n')


def head_in_features(state_dict: Dict[str, torch.Tensor], head_prefix: str = HEAD_PREFIX,
                     backbone_prefix: str = BACKBONE_PREFIX) -> Optional[int]:
    """Width of the features entering the classification layer (pre-logits width, else token width)."""
    pre_logits = state_dict.get(head_prefix + 'pre_logits.weight')
    if pre_logits is not None:
        return pre_logits.shape[0]
    pos_embed = state_dict.get(backbone_prefix + 'pos_embed')
    return None if pos_embed is None else pos_embed.shape[-1]
