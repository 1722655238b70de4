"""The paper's released models by name (:data:`RELEASED`), also in mmpretrain's model index (docs/model_zoo.md)."""
import copy
import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from mmengine.config import Config
from mmpretrain.apis import get_model as build_mmpretrain_model
from modelindex.models.Model import Model as ModelIndexEntry

from vit_plugin.checkpoint import (HUB_PREFIX, CheckpointFileError, HubCheckpointError, is_checkpoint_path,
                                   load_checkpoint_strict, resolve_hub_checkpoint)
from vit_plugin.checkpoint.strict_load import checkpoint_classes
from vit_plugin.compat import mmpretrain as mmpretrain_compat
from vit_plugin.models.backbones.vit_arch import parse_arch

PAPER = dict(Title='An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale',
             URL='https://arxiv.org/abs/2010.11929')

#: mmpretrain's task name for a classifier (what its ``list_models(task=...)`` and inferencers read).
CLASSIFICATION = 'Image Classification'

#: The evaluation split of each classifier's label space (``tools/test.py NAME`` evaluates on it):
#: mmpretrain's ImageNet layout under data/imagenet, as configs/_base_/datasets/imagenet1k_384.py reads it.
TEST_DATASETS: Dict[str, Dict[str, Any]] = {
    'imagenet1k': dict(type='vit_plugin.ImageNet', data_root='data/imagenet', split='val', num_classes=1000),
}

#: The paper's input normalisation: pixels to [-1, 1] (every released checkpoint expects it).
PIXELS_TO_UNIT = dict(mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5], to_rgb=True)

#: The numerics of the weights each entry loads, declared on its backbone so that loading them changes
#: nothing (docs/checkpoints.md#numerics-records): ``transformers``' ``google/vit-*`` ports run exact GELU
#: and LayerNorm eps 1e-12 (their ``config.json``, which their conversion records), timm's ports exact
#: GELU and eps 1e-6; all expect pixels in [-1, 1].
HF_PORT_NUMERICS = dict(gelu_approximate='none', norm_eps=1e-12,
                        expected_input_norm=dict(mean=PIXELS_TO_UNIT['mean'], std=PIXELS_TO_UNIT['std']))
TIMM_PORT_NUMERICS = dict(HF_PORT_NUMERICS, norm_eps=1e-6)


class UnknownModelError(ValueError):
    """A name that is not in the table; the message names the closest ones."""


@dataclass(frozen=True)
class ReleasedModel:
    """One released checkpoint (docs/model_zoo.md#a-model-of-your-own).

    Attributes:
        name (str): Canonical name (mmpretrain's scheme ``{model}_{pre-training}-pre_{source}_{data}``).
        arch, patch_size, img_size: As ``vit_plugin.ViT`` takes them; ``img_size`` is trained and evaluated at.
        weights (str): What :func:`get_model` loads: ``hf-hub:<org>/<name>`` or a path.
        num_classes (int): Classes of its classifier; 0 for a backbone. ``classes``: its label space or None.
        data, official_npz: The data it was trained on, in order; the official JAX file (``gs://vit_models``).
        aliases (tuple[str]): timm's names of the same weights, and the hub id.
        resnet_layers (tuple[int], optional): ResNet units per stage of the hybrid; None: plain ViT.
        paper_top1, paper_source: The paper's ImageNet top-1, if any, and where (or why none).
        recipe, test_dataset: The config under ``configs/`` that trains it; what ``tools/test.py NAME``
            evaluates on (:data:`TEST_DATASETS`).
        numerics (dict): Backbone keywords declaring the numerics of ``weights`` (:data:`HF_PORT_NUMERICS`).
    """
    name: str
    arch: Union[str, Mapping[str, int]]
    patch_size: int
    img_size: int
    weights: str
    num_classes: int = 0
    classes: Optional[str] = None
    data: Tuple[str, ...] = ('ImageNet-21k', )
    official_npz: Optional[str] = None
    aliases: Tuple[str, ...] = ()
    resnet_layers: Optional[Tuple[int, ...]] = None
    paper_top1: Optional[float] = None
    paper_source: str = ''
    recipe: Optional[str] = None
    test_dataset: Optional[Mapping[str, Any]] = field(default=None, compare=False)
    numerics: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_classifier(self) -> bool:
        return self.num_classes > 0

    @property
    def embed_dims(self) -> int:
        return parse_arch(self.arch)['embed_dims']

    def model_config(self) -> Dict[str, Any]:
        """The ``model`` of :meth:`config`: ``ImageClassifier`` with ``vit_plugin.ViT`` or ``HybridViT``."""
        backbone = dict(type='vit_plugin.ViT', arch=copy.deepcopy(self.arch), img_size=self.img_size,
                        patch_size=self.patch_size, **copy.deepcopy(dict(self.numerics)))
        if self.resnet_layers is not None:
            backbone.update(type='vit_plugin.HybridViT', layers=tuple(self.resnet_layers))
        head = None
        if self.is_classifier:
            head = dict(type='VisionTransformerClsHead', num_classes=self.num_classes, in_channels=self.embed_dims,
                        loss=dict(type='CrossEntropyLoss', loss_weight=1.0))
        return dict(type='ImageClassifier', backbone=backbone, neck=None, head=head)

    def config(self, loader: str = 'LoadImageFromFile') -> Config:
        """A complete mmpretrain config, no weights: model, [-1, 1] input norm, evaluation at :attr:`img_size`;
        ``loader`` is the pipeline's image loader (``tools/test.py`` passes ``'vit_plugin.LoadImageFromFile'``)."""
        dataset = dict(self.test_dataset or TEST_DATASETS.get(self.classes) or TEST_DATASETS['imagenet1k'])
        pipeline = [dict(type=loader), dict(type='Resize', scale=(self.img_size, self.img_size)),
                    dict(type='PackInputs')]
        cfg = dict(
            custom_imports=dict(imports=['vit_plugin'], allow_failed_imports=False),
            default_scope='mmpretrain',
            model=self.model_config(),
            data_preprocessor=dict(num_classes=self.num_classes or None, **PIXELS_TO_UNIT),
            test_dataloader=dict(batch_size=32, num_workers=2, persistent_workers=False,
                                 sampler=dict(type='DefaultSampler', shuffle=False),
                                 dataset=dict(dataset, pipeline=pipeline)),
            test_cfg=dict(),
        )
        if self.is_classifier:
            cfg['test_evaluator'] = dict(type='Accuracy', topk=(1, 5) if self.num_classes >= 5 else (1, ))
        return Config(cfg)

    def model_index_entry(self) -> ModelIndexEntry:
        """This model as an entry of mmpretrain's model index (``mmpretrain.apis.ModelHub``)."""
        results = None
        if self.is_classifier:
            metrics = {} if self.paper_top1 is None else {'Top 1 Accuracy': self.paper_top1}
            results = [dict(Task=CLASSIFICATION, Dataset=self.data[-1], Metrics=metrics)]
        return ModelIndexEntry(name=self.name, metadata={'Training Data': list(self.data)}, results=results,
                               weights=self.weights, config=self.config(), paper=PAPER,
                               in_collection='Vision Transformer (vit_plugin)')


def _released() -> List[ReleasedModel]:
    # No paper_top1: see docs/model_zoo.md ("The paper's top-1") for why the column is empty.
    in1k = dict(num_classes=1000, classes='imagenet1k', data=('ImageNet-21k', 'ImageNet-1k'), numerics=HF_PORT_NUMERICS)
    in21k: Dict[str, Any] = dict(numerics=HF_PORT_NUMERICS)
    hub, npz = 'hf-hub:google/', 'imagenet21k+imagenet2012/'
    return [
        ReleasedModel('vit-base-p16_in21k-pre_orig_in1k', 'b', 16, 224, hub + 'vit-base-patch16-224',
                      official_npz=npz + 'ViT-B_16-224.npz', aliases=('vit_base_patch16_224.orig_in21k_ft_in1k', ),
                      **in1k),
        ReleasedModel('vit-large-p16_in21k-pre_orig_in1k', 'l', 16, 224, hub + 'vit-large-patch16-224',
                      official_npz=npz + 'ViT-L_16-224.npz', **in1k),
        ReleasedModel('vit-base-p16_in21k-pre_orig_in1k-384px', 'b', 16, 384, hub + 'vit-base-patch16-384',
                      official_npz=npz + 'ViT-B_16.npz', aliases=('vit_base_patch16_384.orig_in21k_ft_in1k', ),
                      recipe='configs/vit_b16_in21k_ft_in1k_384.py', **in1k),
        ReleasedModel('vit-base-p32_in21k-pre_orig_in1k-384px', 'b', 32, 384, hub + 'vit-base-patch32-384',
                      official_npz=npz + 'ViT-B_32.npz', **in1k),
        ReleasedModel('vit-large-p16_in21k-pre_orig_in1k-384px', 'l', 16, 384, hub + 'vit-large-patch16-384',
                      official_npz=npz + 'ViT-L_16.npz', recipe='configs/vit_l16_in21k_ft_in1k_384.py', **in1k),
        ReleasedModel('vit-large-p32_in21k-pre_orig_in1k-384px', 'l', 32, 384, hub + 'vit-large-patch32-384',
                      official_npz=npz + 'ViT-L_32.npz', aliases=('vit_large_patch32_384.orig_in21k_ft_in1k', ),
                      **in1k),
        ReleasedModel('vit-base-r50-s16_in21k-pre_orig_in1k-384px', 'b', 1, 384,
                      'hf-hub:timm/vit_base_r50_s16_384.orig_in21k_ft_in1k', resnet_layers=(3, 4, 9),
                      official_npz=npz + 'R50+ViT-B_16.npz', aliases=('vit_base_r50_s16_384.orig_in21k_ft_in1k', ),
                      **dict(in1k, numerics=TIMM_PORT_NUMERICS)),
        ReleasedModel('vit-base-p16_orig_in21k', 'b', 16, 224, hub + 'vit-base-patch16-224-in21k',
                      official_npz='imagenet21k/ViT-B_16.npz', aliases=('vit_base_patch16_224.orig_in21k', ),
                      recipe='configs/vit_b16_in21k.py', **in21k),
        ReleasedModel('vit-base-p32_orig_in21k', 'b', 32, 224, hub + 'vit-base-patch32-224-in21k',
                      official_npz='imagenet21k/ViT-B_32.npz', aliases=('vit_base_patch32_224.orig_in21k', ),
                      recipe='configs/vit_b32_in21k.py', **in21k),
        ReleasedModel('vit-large-p16_orig_in21k', 'l', 16, 224, hub + 'vit-large-patch16-224-in21k',
                      official_npz='imagenet21k/ViT-L_16.npz', aliases=('vit_large_patch16_224.orig_in21k', ),
                      recipe='configs/vit_l16_in21k.py', **in21k),
        ReleasedModel('vit-large-p32_orig_in21k', 'l', 32, 224, hub + 'vit-large-patch32-224-in21k',
                      official_npz='imagenet21k/ViT-L_32.npz', aliases=('vit_large_patch32_224.orig_in21k', ),
                      recipe='configs/vit_l32_in21k.py', **in21k),
        ReleasedModel('vit-huge-p14_orig_in21k', 'h', 14, 224, hub + 'vit-huge-patch14-224-in21k',
                      official_npz='imagenet21k/ViT-H_14.npz', aliases=('vit_huge_patch14_224.orig_in21k', ),
                      recipe='configs/vit_h14_in21k.py', **in21k),
        ReleasedModel('vit-base-r50-s16_orig_in21k', 'b', 1, 224, 'hf-hub:timm/vit_base_r50_s16_224.orig_in21k',
                      resnet_layers=(3, 4, 9), official_npz='imagenet21k/R50+ViT-B_16.npz',
                      aliases=('vit_base_r50_s16_224.orig_in21k', ), recipe='configs/vit_r50_b16_in21k.py',
                      numerics=TIMM_PORT_NUMERICS),
    ]


#: The released models by canonical name (in the order of the docs' table); :func:`register_model` adds more.
RELEASED: Dict[str, ReleasedModel] = {}
_ALIASES: Dict[str, str] = {}  # lower-case alias or name -> canonical name


def _lookup_keys(model: ReleasedModel) -> List[str]:
    hub = [model.weights[len(HUB_PREFIX):]] if model.weights.startswith(HUB_PREFIX) else []
    return [key.lower() for key in (model.name, *model.aliases, *hub)]


def register_model(model: ReleasedModel) -> ReleasedModel:
    """Add ``model`` to the table and mmpretrain's index (idempotent); ValueError if a name of it is taken."""
    for key in _lookup_keys(model):
        taken = _ALIASES.get(key)
        if taken is not None and RELEASED[taken] != model:
            raise ValueError(f'{key!r} already names the released model {taken!r}; give {model.name!r} other names')
    mmpretrain_compat.add_to_model_index(model.model_index_entry())
    RELEASED[model.name] = model
    _ALIASES.update({key: model.name for key in _lookup_keys(model)})
    return model


def find_model(name: str) -> ReleasedModel:
    """The entry of ``name`` (canonical, timm name or hub id, any case, ``hf-hub:`` allowed); raises
    UnknownModelError naming the closest names."""
    key = name[len(HUB_PREFIX):] if name.startswith(HUB_PREFIX) else name
    found = _ALIASES.get(key.lower())
    if found is None:
        close = dict.fromkeys(_ALIASES[c] for c in difflib.get_close_matches(key.lower(), list(_ALIASES), n=6,
                                                                             cutoff=0.5))
        hint = f'closest: {", ".join(list(close)[:3])}' if close else 'no name is close'
        raise UnknownModelError(f'no released model is named {name!r} ({hint}).\n'
                                f'vit_plugin.list_models() lists them all (docs/model_zoo.md).')
    return RELEASED[found]


def list_models(pattern: Optional[str] = None, exclude_patterns: Sequence[str] = (),
                task: Optional[str] = None) -> List[str]:
    """Sorted canonical names, filtered as ``mmpretrain.list_models`` does (timm names and hub ids match too);
    ``task`` 'Image Classification' for classifiers, 'null' for backbones."""
    def matches(model: ReleasedModel, patterns: Sequence[str]) -> bool:
        return any(fnmatch.fnmatch(key, p.lower() + '*') for p in patterns for key in _lookup_keys(model))

    found = [m for m in RELEASED.values() if pattern is None or matches(m, [pattern])]
    found = [m for m in found if not matches(m, exclude_patterns)]
    if task is not None:
        found = [m for m in found if (task == 'null' and not m.is_classifier) or (
            task == CLASSIFICATION and m.is_classifier)]
    return sorted(m.name for m in found)


def get_config(name: str) -> Config:
    """The config of a released model (:meth:`ReleasedModel.config`), e.g. to print or to evaluate."""
    return find_model(name).config()


def get_model(name: str, pretrained: Union[bool, str] = False, device: Optional[str] = None,
              backbone_only: bool = False, **kwargs):
    """Build a released model by name and load its weights strictly (docs/model_zoo.md).

    Args:
        name (str): A name of :func:`list_models`, a timm name of the same weights, or the hub id.
        pretrained (bool | str): True: the entry's weights; a path or ``hf-hub:`` id: those weights;
            False: the initialisation only. Defaults to False.
        device (str, optional): Where to put the model. Defaults to None (CPU).
        backbone_only (bool): Load only the backbone's weights of ``pretrained``. Defaults to False.
        **kwargs: Merged into the config's ``model``.

    Returns:
        mmpretrain's ``ImageClassifier`` in eval mode, with its config and class names.

    Raises:
        UnknownModelError: No such name (the message names the closest ones).
        CheckpointError: The weights could not be found or read (offline: not in the cache).
        CheckpointMismatchError: The weights do not fit the model.
    """
    model_entry = find_model(name)
    cfg = model_entry.config()
    if kwargs:
        cfg.merge_from_dict(dict(model=kwargs))
    weights = model_entry.weights if pretrained is True else (pretrained or None)
    if weights is not None:  # before building a model of hundreds of millions of weights: is it there?
        if weights.startswith(HUB_PREFIX):
            try:
                resolve_hub_checkpoint(weights)
            except HubCheckpointError as err:  # as the loader itself reports it
                raise CheckpointFileError(str(err)) from None
        elif not is_checkpoint_path(weights):
            raise FileNotFoundError(f'{weights}: no such checkpoint file or folder (pretrained= of '
                                    f'{model_entry.name!r}); give a path, an hf-hub: id, or True.')
    model = build_mmpretrain_model(cfg, pretrained=False)  # class names: the test dataset's, as mmpretrain reads them
    if weights is not None:
        whole = model_entry.is_classifier and not backbone_only
        loaded = load_checkpoint_strict(model, weights, backbone_only=not whole, option='backbone_only=True')
        classes = checkpoint_classes(loaded) if whole else None
        if classes:
            mmpretrain_compat.set_dataset_meta(model, classes)
    mmpretrain_compat.set_model_index_entry(model, model_entry.model_index_entry())
    if device is not None:
        model.to(device)
    return model.eval()


for _model in _released():
    register_model(_model)
