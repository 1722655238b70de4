"""Private names of mmpretrain that vit_plugin needs.

Checked against mmpretrain 1.2.0 and onedl-mmpretrain 1.3.6 (the same code at every access below).
"""
from typing import Any, Dict

from vit_plugin.compat import Inherited

__all__ = ['dataset_meta', 'set_dataset_meta', 'INHERITED']


def dataset_meta(model) -> Any:
    """The dataset meta (``classes`` ...) ``mmpretrain.get_model`` attached to a model, or None.

    ``get_model`` stores it as ``model._dataset_meta`` and ``ImageClassificationInferencer`` reads
    its class names from there; there is no public attribute for it.
    """
    return getattr(model, '_dataset_meta', None)


def set_dataset_meta(model, meta) -> None:
    """Attach ``meta`` where ``ImageClassificationInferencer`` looks for the class names (see
    :func:`dataset_meta`)."""
    model._dataset_meta = meta


_CLS_INFERENCER = 'vit_plugin.inference:CheckedImageClassificationInferencer'

#: Private members of mmpretrain classes that our subclasses override or read (see the package docstring).
INHERITED: Dict[str, Inherited] = {
    '_init_pipeline': Inherited(
        'mmpretrain.apis.image_classification:ImageClassificationInferencer', (_CLS_INFERENCER,),
        "builds the test pipeline from the config; the inferencer's only place to drop the file loaders"),
    '_get_chunk_data': Inherited(
        'mmpretrain.apis.base:BaseInferencer', (_CLS_INFERENCER,),
        'groups the inputs into batches, as the base preprocess does'),
    '_reshape': Inherited(
        'mmpretrain.models.selfsup.maskfeat:HOGGenerator', ('vit_plugin.models.selfsup.hog:PatchHOGGenerator',),
        "turns HOG features into per-patch targets; the generator's only step that knows the patch grid"),
}
