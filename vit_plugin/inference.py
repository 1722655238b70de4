"""mmpretrain's and mmdet's inferencers, checkpoints loaded strictly, images decoded whole (docs/inference.md)."""
import copy
from typing import Optional

import mmengine.fileio as fileio
import numpy as np
from mmcv.transforms import Compose
from mmengine.dataset import default_collate
from mmengine.registry import DefaultScope
from mmpretrain.apis import ImageClassificationInferencer, get_model

from vit_plugin.compat import mmpretrain as mmpretrain_compat
from vit_plugin.checkpoint.strict_load import (checkpoint_classes, fit_state_dict, load_checkpoint_strict,
                                       load_state_dict_strict, state_dict_of)
from vit_plugin.datasets.decode import DEFAULT_MAX_PIXELS, decode_image
from vit_plugin.datasets.transforms import LoadImageFromFile

#: Names under which configs load images (replaced by the inferencers' own loading).
_LOADERS = ('LoadImageFromFile', 'vit_plugin.LoadImageFromFile', 'mmcv.LoadImageFromFile',
            'mmpretrain.LoadImageFromFile', 'mmdet.LoadImageFromFile')


def read_image(path: str, max_pixels: Optional[int] = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """The BGR pixels of the image file ``path`` (checked decoding)."""
    return decode_image(fileio.get(path), path, max_pixels=max_pixels)


class CheckedImageClassificationInferencer(ImageClassificationInferencer):
    """mmpretrain's ``ImageClassificationInferencer`` decoding files with ``decode_image`` (arrays: BGR as given),
    ``max_pixels`` bounding height x width; build it with :func:`build_classification_inferencer`."""

    def __init__(self, model, *args, max_pixels: Optional[int] = DEFAULT_MAX_PIXELS, **kwargs):
        self.max_pixels = max_pixels
        super().__init__(model, *args, **kwargs)

    def _init_pipeline(self, cfg):
        steps = [t for t in cfg.test_dataloader.dataset.pipeline if not (isinstance(t, dict) and t['type'] in _LOADERS)]
        from mmpretrain.registry import TRANSFORMS
        # The config's unprefixed names are mmpretrain's, whatever scope an earlier runner of this process
        # left current (a runner of another toolkit's config would send them to its registry).
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            return Compose([TRANSFORMS.build(t) for t in steps])

    def preprocess(self, inputs, batch_size: int = 1):
        def load_image(item):
            img = read_image(item, self.max_pixels) if isinstance(item, str) else item
            return dict(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2])

        pipeline = Compose([load_image, self.pipeline])
        yield from map(default_collate, self._get_chunk_data(map(pipeline, inputs), batch_size))


def build_classification_inferencer(cfg, checkpoint: str, device: str = 'cpu', backbone_only: bool = False,
                                    max_pixels: Optional[int] = DEFAULT_MAX_PIXELS
                                    ) -> CheckedImageClassificationInferencer:
    """A classification inferencer for ``cfg`` with ``checkpoint`` loaded strictly.

    Raises CheckpointMismatchError when the checkpoint does not fit the config's model."""
    model = get_model(cfg, pretrained=False, device='cpu')
    loaded = load_checkpoint_strict(model, checkpoint, backbone_only=backbone_only)
    classes = None if backbone_only else checkpoint_classes(loaded)  # another head's names otherwise
    if classes:
        mmpretrain_compat.set_dataset_meta(model, classes)
    model.to(device)
    return CheckedImageClassificationInferencer(model, pretrained=False, device=device, max_pixels=max_pixels)


try:  # mmdet is the optional [det] extra
    from mmdet.apis import DetInferencer
except ModuleNotFoundError as err:
    if not (err.name or '').startswith('mmdet'):
        raise
    DetInferencer = None

if DetInferencer is not None:

    class CheckedDetInferencer(DetInferencer):
        """mmdet's ``DetInferencer``, ``weights`` loaded strictly (``backbone_only``: the backbone's only), files
        decoded by ``decode_image``, ``max_pixels`` bounding height x width."""

        def __init__(self, model, weights: Optional[str] = None, device: Optional[str] = None, *,
                     backbone_only: bool = False, max_pixels: Optional[int] = DEFAULT_MAX_PIXELS, **kwargs):
            self.backbone_only = backbone_only
            self.max_pixels = max_pixels
            self._weights_name = weights
            super().__init__(model=model, weights=weights, device=device, **kwargs)

        def _load_weights_to_model(self, model, checkpoint, cfg) -> None:
            if checkpoint is not None:
                source = str(self._weights_name)
                state = fit_state_dict(model, state_dict_of(checkpoint, source), source, self.backbone_only)
                load_state_dict_strict(model, state, source, self.backbone_only)
                checkpoint = dict(checkpoint, state_dict=state)
            super()._load_weights_to_model(model, checkpoint, cfg)  # class names and palette, as mmdet does

        def _init_pipeline(self, cfg):
            cfg = copy.deepcopy(cfg)
            steps = cfg.test_dataloader.dataset.pipeline
            for step in steps:
                if isinstance(step, dict) and step['type'] in _LOADERS:
                    step['type'] = 'LoadImageFromFile'  # what mmdet's inferencer looks for and replaces
                    step.pop('max_pixels', None)
            pipeline = super()._init_pipeline(cfg)
            for step in pipeline.transforms:
                loader = getattr(step, 'from_file', None)  # mmdet's InferencerLoader: paths -> mmcv's loader
                if loader is not None:
                    step.from_file = LoadImageFromFile(to_float32=loader.to_float32, color_type=loader.color_type,
                                                       backend_args=loader.backend_args, max_pixels=self.max_pixels)
            return pipeline

        def visualize(self, inputs, preds, **kwargs):
            # mmdet draws on RGB arrays as given and reads paths with its own decoder: give it our pixels.
            inputs = [np.ascontiguousarray(read_image(item, self.max_pixels)[..., ::-1]) if isinstance(item, str)
                      else item for item in inputs]
            return super().visualize(inputs, preds, **kwargs)
