"""Datasheet peak rates of common GPUs, for model-FLOP utilisation (MFU) against the vendor's number.

The figures are the vendors' *dense* tensor-core rates in TFLOP/s (datasheets often print the
2:4-sparse rate, twice as high, with a footnote; those are halved here). They are a ceiling no real
kernel reaches; the benchmark also reports utilisation against a matmul it times on the same GPU in
the same run, which is the more honest reference for comparing runs across machines.
"""
import re
from typing import Dict, Optional

import torch

# (pattern matched against torch.cuda.get_device_name(), {dtype: dense TFLOP/s}); first match wins,
# so specific variants come before the family name.
_DATASHEET = [
    (r'H100.*PCIe', {'bf16': 756., 'fp16': 756.}),
    (r'H100.*NVL', {'bf16': 835., 'fp16': 835.}),
    (r'GH200|H100|H800', {'bf16': 989., 'fp16': 989.}),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    (r'H200.*NVL', {'bf16': 835., 'fp16': 835.}),
    (r'H200', {'bf16': 989., 'fp16': 989.}),
    (r'A100|A800', {'bf16': 312., 'fp16': 312.}),
    (r'L40S', {'bf16': 362., 'fp16': 362.}),
    (r'L40\b', {'bf16': 181., 'fp16': 181.}),
    (r'\bL4\b', {'bf16': 121., 'fp16': 121.}),
    (r'\bA10\b', {'bf16': 125., 'fp16': 125.}),
    (r'V100.*PCIe', {'fp16': 112.}),
    (r'V100', {'fp16': 125.}),  # no bf16 tensor cores
    (r'\bT4\b', {'fp16': 65.}),
    (r'MI300X', {'bf16': 1307., 'fp16': 1307.}),
]


def datasheet_tflops(name: str, dtype: str = 'bf16') -> Optional[float]:
    """Dense tensor-core TFLOP/s of the GPU called ``name`` in ``dtype`` ('bf16' or 'fp16'), or None
    when the GPU (or the dtype on it) is not in the table."""
    for pattern, rates in _DATASHEET:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return rates.get(dtype)
    return None


def cuda_device_info(index: Optional[int] = None) -> Dict[str, object]:
    """Name, compute capability, memory and datasheet rates of a CUDA device (empty without CUDA)."""
    if not torch.cuda.is_available():
        return {}
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    return dict(name=props.name, capability=f'{props.major}.{props.minor}',
                memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                datasheet_bf16_tflops=datasheet_tflops(props.name, 'bf16'),
                datasheet_fp16_tflops=datasheet_tflops(props.name, 'fp16'))
