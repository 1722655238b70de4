"""The datasheet rates the benchmarks set model-FLOP utilisation against."""
from benchmarks.gpu_datasheet import datasheet_tflops


def test_datasheet_table_matches_device_names():
    assert datasheet_tflops('NVIDIA H100 80GB HBM3') == 989.  # SXM
    assert datasheet_tflops('NVIDIA H100 PCIe') == 756.
    assert datasheet_tflops('NVIDIA A100-SXM4-80GB') == datasheet_tflops('NVIDIA A100 80GB PCIe') == 312.
    assert datasheet_tflops('NVIDIA L40S') == 362. and datasheet_tflops('NVIDIA L4') == 121.
    assert datasheet_tflops('Tesla V100-SXM2-32GB') is None  # no bf16 tensor cores
    assert datasheet_tflops('Tesla V100-SXM2-32GB', 'fp16') == 125.
    assert datasheet_tflops('NVIDIA GeForce GTX 1080') is None  # "unknown" in the report
