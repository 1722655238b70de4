from .features import FEATURE_STAGES, TOKEN_POOLS, iter_feature_records, pool_features, unwrap_model
from .fewshot import (DEFAULT_L2_GRID, RidgeSolver, fewshot_linear_eval, format_results, sample_k_shot, select_l2,
                      signed_one_hot)
from .fewshot_metric import FewShotLinearMetric, FewShotValLoop, run_fewshot_eval

__all__ = [
    'DEFAULT_L2_GRID', 'FEATURE_STAGES', 'TOKEN_POOLS', 'FewShotLinearMetric', 'FewShotValLoop', 'RidgeSolver',
    'fewshot_linear_eval', 'format_results', 'iter_feature_records', 'pool_features', 'run_fewshot_eval',
    'sample_k_shot', 'select_l2', 'signed_one_hot', 'unwrap_model'
]
