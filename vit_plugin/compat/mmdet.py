"""Private names of mmdet that vit_plugin needs; checked against mmdet 3.3.0 and onedl-mmdetection 3.5.1."""
from typing import Dict

from vit_plugin.compat import Inherited

__all__ = ['INHERITED']

_DET_INFERENCER = 'vit_plugin.inference:CheckedDetInferencer'

#: Private members of mmdet classes that our subclasses override or read (see the package docstring).
INHERITED: Dict[str, Inherited] = {
    '_load_weights_to_model': Inherited(
        'mmdet.apis.det_inferencer:DetInferencer', (_DET_INFERENCER,),
        "loads the checkpoint into the model and takes class names and palette from its meta; the "
        "inferencer's only place to load strictly"),
    '_init_pipeline': Inherited(
        'mmdet.apis.det_inferencer:DetInferencer', (_DET_INFERENCER,),
        "builds the test pipeline and swaps the file loader for mmdet's InferencerLoader; ours decodes "
        'files with vit_plugin\'s loader'),
}
