from .checked import DataRootNotFoundError, check_dataset_paths  # noqa: F401
from .digits import DigitsDataset, prepare_digits_dataset  # noqa: F401
from .label_subset import LabelSubsetDataset, class_balanced_indices, sample_k_shot  # noqa: F401
from .decode import DEFAULT_MAX_PIXELS, ImageDecodeError, decode_image, inspect_image  # noqa: F401
from .skip import BadSampleLimitExceeded, SkipBadSamples  # noqa: F401
from .shards import (HubOfflineError, RangesNotSupportedError, RetryPolicy, ShardNotFoundError,  # noqa: F401
                     ShardReadError, ShardReader, ShardUnavailableError,
                     compressed_tars_in_folder, fingerprint, fingerprints_in_folder, is_compressed_tar,
                     is_remote, join_url, list_folder, list_shards_in_folder, open_for_scan,
                     read_small_file, resolve_hf_url)
from .transforms import LoadAndInceptionCrop, LoadImageFromFile, inception_crop_box  # noqa: F401
from .tar_index import LabelRule, ShardList, TarIndexError, TarShardIndex, expand_braces, resolve_shards  # noqa: F401
from .shard_dataset import SampleReadError, TarShardDataset  # noqa: F401
from .samplers import BlockShuffleSampler, epoch_order  # noqa: F401

try:  # the detection dataset subclasses mmdet's CocoDataset; mmdet is the optional [det] extra
    from .shapes_coco import (CLASSES as SHAPES_CLASSES, ShapesCocoDataset,  # noqa: F401
                              ShapesUnlabelledDataset, make_shapes_coco)
except ModuleNotFoundError as err:
    if not (err.name or '').startswith('mmdet'):
        raise
