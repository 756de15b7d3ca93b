"""NVIDIA's evaluation crop (data.val_crop_padding): resize to image_size + 32, centre crop image_size, the same
on the torchvision and the DALI backend, for the experiments that compare with NVIDIA's published numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from imgcls.data.backends import make_backend
from imgcls.data.protocol import LoaderSpec
from imgcls.data.transforms import val_resize_size, val_transform
from tests.conftest import compose_config, make_image_folder

# experiment -> (image size, NVIDIA's val resize): PyTorch get_pytorch_val_loader / HybridValPipe crop_padding 32,
# TF1's _RESIZE_MIN 256, TF2's central crop of image_size / (image_size + 32).
CASES = {
    "resnet50_dgxa100_amp_90e": (224, 256),
    "efficientnet_b4_dgxa100_amp_400e": (380, 412),
    "tf1_resnet50_dgx1v_amp_90e": (224, 256),
    "tf2_efficientnet_b4_32xa100_amp": (380, 412),
}


def _resize_of(transform: T.Compose) -> int:
    resize = next(t for t in transform.transforms if isinstance(t, T.Resize))
    return resize.size if isinstance(resize.size, int) else resize.size[0]


@pytest.mark.parametrize("experiment", sorted(CASES))
def test_nvidia_experiments_resize_like_nvidia_on_torchvision(experiment: str) -> None:
    size, resize = CASES[experiment]
    data = compose_config([f"experiment={experiment}"]).data
    assert (data.image_size, val_resize_size(data, size), _resize_of(val_transform(data))) == (size, resize, resize)


def test_without_padding_the_crop_ratio_applies() -> None:
    """The default (timm's 0.875) is what the experiments above replace: 434 for B4, not NVIDIA's 412."""
    data = compose_config(["model=efficientnet_b4"]).data
    assert data.val_crop_padding is None and _resize_of(val_transform(data)) == 434


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["resnet50_dgxa100_amp_90e", "efficientnet_b4_dgxa100_amp_400e"])
def test_dali_val_pipeline_resizes_like_torchvision(
    experiment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dali_cpu builds its val pipeline with the same resize as torchvision (412 for B4, 256 for RN50), and its
    images agree with torchvision's to within DALI's resampling arithmetic (tests/test_dali.py's bound)."""
    pytest.importorskip("nvidia.dali")
    import imgcls.data.dali.backend as dali_backend

    size, resize = CASES[experiment]
    root = make_image_folder(tmp_path, classes=2, train_per_class=1, val_per_class=2, size=(size * 3 // 2, size + 50))
    cfg = compose_config([f"experiment={experiment}", f"data.root={root}", "data.backend=dali_cpu",
                          "data.num_workers=1", "hardware.devices=1"])  # fmt: skip
    seen: list[int] = []
    real = dali_backend.val_pipeline

    def recording(**kwargs):  # the real pipeline; only its resize argument is noted
        seen.append(kwargs["resize"])
        return real(**kwargs)

    monkeypatch.setattr(dali_backend, "val_pipeline", recording)
    backend = make_backend(cfg.data)
    loader = backend.loader(LoaderSpec("val", 4))
    dali = torch.cat([backend.on_device(batch)[0].float().cpu() for batch in loader])
    assert seen == [resize] and dali.shape == (4, 3, size, size)
    transform = val_transform(cfg.data)
    files = sorted((root / "val").rglob("*.jpg"))
    reference = torch.stack([transform(Image.open(f).convert("RGB")) for f in files])
    if cfg.data.channels_last:
        dali = dali.contiguous()
    assert (dali - reference).abs().mean() < 0.01
