"""The released models of :mod:`vit_plugin.zoo` as the table of docs/model_zoo.md, parameters counted.

    python tools/analysis/model_zoo.py [PATTERN] [--out model_zoo.md]

Each model is built on PyTorch's meta device (shapes only, no memory, no initialisation cost) from the
config its name gives, and its parameters are counted; nothing is downloaded.
"""
import argparse
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

from vit_plugin.zoo import RELEASED, ReleasedModel, list_models


def count_parameters(model: ReleasedModel) -> int:
    """The number of parameters of ``model`` as its config builds it (buffers not counted)."""
    with torch.device('meta'), DefaultScope.overwrite_default_scope('mmpretrain'):
        built = MODELS.build(model.config().model)
    return sum(p.numel() for p in built.parameters())


def zoo_rows(names: Optional[Sequence[str]] = None) -> List[Dict[str, str]]:
    """One row per model (all, or ``names``): name, source, parameters, the paper's top-1, recipe."""
    rows = []
    for name in names if names is not None else list(RELEASED):
        model = RELEASED[name]
        source = f'`{model.weights}`' + (f'<br>`{model.official_npz}`' if model.official_npz else '')
        rows.append({
            'name': f'`{model.name}`' + ''.join(f'<br>`{alias}`' for alias in model.aliases),
            'model': f'{model.img_size} px, ' + (f'{model.num_classes} classes ({model.classes})'
                                                 if model.is_classifier else 'backbone'),
            'weights (hub; official .npz)': source,
            'parameters': f'{count_parameters(model):,}',
            'paper top-1': '' if model.paper_top1 is None else f'{model.paper_top1:.2f} ({model.paper_source})',
            'recipe': f'`{model.recipe}`' if model.recipe else '',
        })
    return rows


def format_markdown(rows: List[Dict[str, str]]) -> str:
    columns = list(rows[0]) if rows else []
    lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
    lines += ['| ' + ' | '.join(row[c] for c in columns) + ' |' for row in rows]
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('pattern', nargs='?', default=None, help="only these models, e.g. 'vit-large*'")
    parser.add_argument('--out', default=None, help='also write the table to this Markdown file')
    args = parser.parse_args(argv)
    names = list_models(args.pattern)
    table = format_markdown(zoo_rows([n for n in RELEASED if n in names]))
    print(table)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(table + '\n')
    return table
