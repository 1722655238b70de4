"""Private names of mmpretrain that vit_plugin needs; checked against mmpretrain 1.2.0 and onedl-mmpretrain 1.3.6."""
from typing import Any, Dict

from vit_plugin.compat import Inherited

__all__ = ['add_to_model_index', 'dataset_meta', 'set_dataset_meta', 'set_model_index_entry', 'INHERITED']


def dataset_meta(model) -> Any:
    """The dataset meta ``get_model`` attached as ``model._dataset_meta`` (the inferencers read it), or None."""
    return getattr(model, '_dataset_meta', None)


def set_dataset_meta(model, meta) -> None:
    """Attach ``meta`` where ``ImageClassificationInferencer`` looks for class names."""
    model._dataset_meta = meta


def add_to_model_index(entry) -> None:
    """Put a ``modelindex`` entry into ``ModelHub._models_dict`` (idempotent; ValueError if the name is taken):
    the public ``register_model_index`` reads config files (docs/model_zoo.md#mmpretrains-model-index)."""
    from mmpretrain.apis import ModelHub
    models = ModelHub._models_dict
    key = entry.name.lower()
    if key in models and models[key].weights != entry.weights:
        raise ValueError(f'the model name {entry.name!r} is already in mmpretrain\'s model index with weights '
                         f'{models[key].weights}; pick another name')
    models[key] = entry


def set_model_index_entry(model, entry) -> None:
    """Attach a model's index entry as ``model._metainfo``, where ``inference_model`` reads its task."""
    model._metainfo = entry


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
