"""Analysis of trained ViTs: the paper's Figures 6-7 and a model-size summary (not imported by ``vit_plugin``).

Import it explicitly (``import vit_plugin.analysis``); it needs matplotlib for the figures.
"""
from .complexity import (PAPER_MODELS, PAPER_TABLE1, config_row, format_markdown, measure_model, summary_rows,
                         vit_flops, vit_param_count)
from .figures import (attention_distance_figure, attention_distances, filters_figure, pos_embed_figure,
                      rollout_figure, rollout_maps, summary_figure)
from .images import images_from_config, images_from_files, load_images
from .loading import WrongModelError, find_vit, load_checkpoint_checked, load_config, load_model
from .maps import (attention_rollout, mean_attention_distance, patch_embedding_components, pos_embed_similarity,
                   rollout_to_map, stack_attention_distances)

__all__ = [
    'PAPER_MODELS', 'PAPER_TABLE1', 'WrongModelError', 'attention_distance_figure', 'attention_distances',
    'attention_rollout', 'config_row', 'filters_figure', 'find_vit', 'format_markdown', 'images_from_config',
    'images_from_files', 'load_checkpoint_checked', 'load_config', 'load_images', 'load_model',
    'mean_attention_distance', 'measure_model', 'patch_embedding_components', 'pos_embed_figure',
    'pos_embed_similarity', 'rollout_figure', 'rollout_maps', 'rollout_to_map', 'stack_attention_distances',
    'summary_figure', 'summary_rows', 'vit_flops', 'vit_param_count'
]
