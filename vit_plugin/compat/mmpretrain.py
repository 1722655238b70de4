"""Private names of mmpretrain that vit_plugin needs.

Checked against mmpretrain 1.2.0 and onedl-mmpretrain 1.3.6 (the same code at every access below).
"""
from typing import Any, Dict

from vit_plugin.compat import Inherited

__all__ = ['add_to_model_index', 'dataset_meta', 'set_dataset_meta', 'set_model_index_entry', 'INHERITED']


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


def add_to_model_index(entry) -> None:
    """Put one ``modelindex`` entry into mmpretrain's model index, which ``get_model``, ``list_models``,
    ``inference_model`` and the inferencers read by name.

    ``ModelHub.register_model_index`` is the public way, but it reads a model-index.yml file whose
    entries name config *files* (checked in mmpretrain 1.2.0 and onedl-mmpretrain 1.3.6), and raises when
    the same file is registered twice; vit_plugin's released models build their configs in code (so the
    names work from an installed wheel, without configs/, and ``vit_plugin.zoo.register_model`` adds
    models at run time), and the index accepts a config object as well. This
    does what ``register_model_index`` does for each entry of such a file: it keys the entry by its
    lower-case name in ``ModelHub._models_dict`` and refuses a name that is taken by another entry
    (registering the same name twice is a no-op).

    Raises:
        ValueError: the name is taken by a model of mmpretrain's or another registration.
    """
    from mmpretrain.apis import ModelHub
    models = ModelHub._models_dict
    key = entry.name.lower()
    if key in models and models[key].weights != entry.weights:
        raise ValueError(f'the model name {entry.name!r} is already in mmpretrain\'s model index with weights '
                         f'{models[key].weights}; pick another name')
    models[key] = entry


def set_model_index_entry(model, entry) -> None:
    """Attach a model's index entry where ``mmpretrain.inference_model`` looks for its task
    (``get_model`` stores it as ``model._metainfo``; there is no public attribute for it)."""
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
