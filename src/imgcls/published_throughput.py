"""NVIDIA's published PyTorch training throughput, and what it says about another machine's training time.

The numbers are the "Training performance" tables of NVIDIA's ResNet50 v1.5, ResNeXt101-32x4d, SE-ResNeXt101-32x4d
and EfficientNet READMEs (PyTorch 21.03 NGC container), as docs/reference/nvidia-training-performance.md copies
them (A.2-A.5); tests/test_plan_mode.py checks every number here against that file. Keys: (imgcls model name,
hardware profile, precision); NVIDIA's TF32 column is `tf32` on DGX A100, its FP32 column `fp32` on DGX-1.
"""

from __future__ import annotations

# (model, hardware, precision) -> {GPUs: img/s}
THROUGHPUT: dict[tuple[str, str, str], dict[int, int]] = {
    ("resnet50", "dgxa100", "tf32"): {1: 938, 8: 7248},
    ("resnet50", "dgxa100", "amp"): {1: 2470, 8: 16621},
    ("resnet50", "dgx1v", "fp32"): {1: 367, 8: 2855},
    ("resnet50", "dgx1v", "amp"): {1: 1200, 8: 8322},
    ("resnet50", "dgx1v_32g", "fp32"): {1: 356, 8: 2766},
    ("resnet50", "dgx1v_32g", "amp"): {1: 1156, 8: 8056},
    ("resnext101_32x4d", "dgxa100", "tf32"): {1: 456, 8: 3471},
    ("resnext101_32x4d", "dgxa100", "amp"): {1: 1211, 8: 7925},
    ("resnext101_32x4d", "dgx1v", "fp32"): {1: 147, 8: 1133},
    ("resnext101_32x4d", "dgx1v", "amp"): {1: 587, 8: 4065},
    ("resnext101_32x4d", "dgx1v_32g", "fp32"): {1: 144, 8: 1108},
    ("resnext101_32x4d", "dgx1v_32g", "amp"): {1: 565, 8: 3863},
    ("se_resnext101_32x4d", "dgxa100", "tf32"): {1: 395, 8: 2991},
    ("se_resnext101_32x4d", "dgxa100", "amp"): {1: 855, 8: 5779},
    ("se_resnext101_32x4d", "dgx1v", "fp32"): {1: 132, 8: 1004},
    ("se_resnext101_32x4d", "dgx1v", "amp"): {1: 443, 8: 2971},
    ("se_resnext101_32x4d", "dgx1v_32g", "fp32"): {1: 130, 8: 992},
    ("se_resnext101_32x4d", "dgx1v_32g", "amp"): {1: 427, 8: 2925},
    ("efficientnet_b0", "dgxa100", "tf32"): {1: 1078, 8: 8193, 16: 16137},
    ("efficientnet_b0", "dgxa100", "amp"): {1: 2489, 8: 16652, 16: 29332},
    ("efficientnet_b4", "dgxa100", "tf32"): {1: 157, 8: 1223, 16: 2417, 32: 4813, 64: 9146},
    ("efficientnet_b4", "dgxa100", "amp"): {1: 331, 8: 2570, 16: 4813, 32: 9425, 64: 18900},
    ("efficientnet_widese_b0", "dgxa100", "tf32"): {1: 1078, 8: 8244, 16: 16062},
    ("efficientnet_widese_b0", "dgxa100", "amp"): {1: 2512, 8: 16368, 16: 29798},
    ("efficientnet_widese_b4", "dgxa100", "tf32"): {1: 157, 8: 1223, 16: 2399, 32: 4616, 64: 9140},
    ("efficientnet_widese_b4", "dgxa100", "amp"): {1: 331, 8: 2585, 16: 5041, 32: 9379, 64: 18516},
    ("efficientnet_b0", "dgx1v", "fp32"): {1: 655, 8: 4672},
    ("efficientnet_b0", "dgx1v", "amp"): {1: 1301, 8: 7789},
    ("efficientnet_b4", "dgx1v", "fp32"): {1: 83, 8: 616},
    ("efficientnet_b4", "dgx1v", "amp"): {1: 204, 8: 1366},
    ("efficientnet_widese_b0", "dgx1v", "fp32"): {1: 655, 8: 4592},
    ("efficientnet_widese_b0", "dgx1v", "amp"): {1: 1299, 8: 7875},
    ("efficientnet_widese_b4", "dgx1v", "fp32"): {1: 83, 8: 612},
    ("efficientnet_widese_b4", "dgx1v", "amp"): {1: 204, 8: 1356},
    ("efficientnet_b0", "dgx1v_32g", "fp32"): {1: 646, 8: 4937},
    ("efficientnet_b0", "dgx1v_32g", "amp"): {1: 1401, 8: 8615},
    ("efficientnet_b4", "dgx1v_32g", "fp32"): {1: 36, 8: 641},
    ("efficientnet_b4", "dgx1v_32g", "amp"): {1: 89, 8: 1565},
    ("efficientnet_widese_b0", "dgx1v_32g", "fp32"): {1: 281, 8: 4924},
    ("efficientnet_widese_b0", "dgx1v_32g", "amp"): {1: 603, 8: 8870},
    ("efficientnet_widese_b4", "dgx1v_32g", "fp32"): {1: 36, 8: 639},
    ("efficientnet_widese_b4", "dgx1v_32g", "amp"): {1: 89, 8: 1556},
}


def throughput(model: str, hardware: str, precision: str, gpus: int) -> float | None:
    """img/s NVIDIA measured for this model on `gpus` GPUs of this machine; between two published GPU counts (or
    past the largest), the per-GPU rate of the largest published count not above `gpus`, times `gpus`. None
    when NVIDIA published no row for the model, machine and precision."""
    rows = THROUGHPUT.get((model, hardware, precision))
    if not rows or gpus < 1:
        return None
    if gpus in rows:
        return float(rows[gpus])
    below = max(n for n in rows if n <= gpus)
    return rows[below] / below * gpus


def scaled_hours(
    hours: float, published: tuple[str, str, str, int], planned: tuple[str, str, str, int]
) -> float | None:
    """NVIDIA's training time for `published` (model, hardware, precision, GPUs) scaled to `planned` by the ratio of
    NVIDIA's throughputs: an estimate (the same epochs and images; data loading and scaling as NVIDIA's)."""
    here, there = throughput(*planned), throughput(*published)
    return None if here is None or there is None else hours * there / here
