"""The resize modes recorded in checkpoints (``vit_plugin.checkpoint.records``) keep their meaning."""
import pytest
import torch

from vit_plugin.checkpoint.records import decode_resize_mode, encode_resize_mode
from vit_plugin.models.pos_embed import RESIZE_MODES


def test_recorded_resize_modes_keep_their_meaning():
    # Files store an index: the table must never be reordered (these indices are in files on disk).
    assert [int(encode_resize_mode(m)) for m in ('official', 'bilinear', 'bicubic')] == [0, 1, 2]
    for mode in RESIZE_MODES:  # every mode the models know can be recorded and read back
        assert decode_resize_mode(encode_resize_mode(mode)) == mode
    with pytest.raises(ValueError, match='pos_embed_resize_mode.*Delete the key'):
        decode_resize_mode(torch.tensor(7))
