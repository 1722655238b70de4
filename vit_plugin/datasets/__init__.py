from .checked import DataRootNotFoundError, check_dataset_paths  # noqa: F401
from .digits import DigitsDataset, prepare_digits_dataset  # noqa: F401

try:  # the detection dataset subclasses mmdet's CocoDataset; mmdet is the optional [det] extra
    from .shapes_coco import CLASSES as SHAPES_CLASSES, ShapesCocoDataset, make_shapes_coco  # noqa: F401
except ModuleNotFoundError as err:
    if not (err.name or '').startswith('mmdet'):
        raise
