"""recipe.mixup_mode=elem (the TF1 and TF2 recipes) with imgcls.training.mixup.DeviceMixup: timm's per-sample mixup /
cutmix drawn and mixed on the batch's device, without timm's host-to-device copy of the lambdas at every step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from timm.data import Mixup
from timm.data.mixup import mixup_target

from imgcls.training.mixup import DeviceMixup
from tests.test_host_sync import SyncCounter, count_syncs

# (mixup_alpha, cutmix_alpha, prob, cutmix_minmax): the TF recipes' mixup 0.2 (prob 1), mixup gated by prob,
# cutmix alone, both (per-sample switch), and timm's min-max boxes.
SETTINGS = {
    "mixup": (0.2, 0.0, 1.0, None),
    "mixup_prob": (0.2, 0.0, 0.6, None),
    "cutmix": (0.0, 1.0, 1.0, None),
    "both": (0.2, 1.0, 0.7, None),
    "minmax": (0.0, 1.0, 0.8, (0.2, 0.8)),
}
CLASSES = 5


def mixers(setting: str, smoothing: float = 0.1) -> tuple[Mixup, DeviceMixup]:
    mixup, cutmix, prob, minmax = SETTINGS[setting]
    kwargs: dict[str, Any] = dict(mixup_alpha=mixup, cutmix_alpha=cutmix, prob=prob, cutmix_minmax=minmax,
                                  mode="elem", label_smoothing=smoothing, num_classes=CLASSES)  # fmt: skip
    return Mixup(**kwargs), DeviceMixup(**kwargs)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance (largest gap between the empirical CDFs); valid for the cutmix
    lambdas too, which take the discrete values a box's area allows."""
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, points, side="right") / len(a)
    cdf_b = np.searchsorted(b, points, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_per_sample_lambdas_have_timms_distribution(setting: str) -> None:
    """20k lambdas each, after cutmix's area correction, on 12x10 images (not square: height and width kept
    apart). KS distance below 0.02: 1.95 sqrt(2/n), the 0.1% critical value for identical distributions."""
    timm_mixup, device_mixup = mixers(setting)
    n = 20_000
    images = torch.zeros(n, 1, 12, 10)
    np.random.seed(0)
    theirs = timm_mixup._mix_elem(images.clone()).squeeze(1).numpy()
    torch.manual_seed(0)
    ours = device_mixup._mix_elem(images.clone()).squeeze(1).numpy()
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert ours.mean() == pytest.approx(theirs.mean(), abs=0.015)
    assert ours.var() == pytest.approx(theirs.var(), abs=0.01)
    unmixed_ours, unmixed_theirs = (ours == 1).mean(), (theirs == 1).mean()
    # 4 standard deviations of the difference of two such shares
    assert unmixed_ours == pytest.approx(unmixed_theirs, abs=4 * np.sqrt(2 * unmixed_theirs * (1 - unmixed_theirs) / n))
    if SETTINGS[setting][2] < 1:  # prob < 1: a share 1 - prob (at least) is left unmixed
        assert unmixed_theirs >= 1 - SETTINGS[setting][2] - 0.02
    assert ks_statistic(ours, theirs) < 0.02
    assert ((ours >= 0) & (ours <= 1)).all()


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_each_sample_is_mixed_with_its_mirror_by_its_lambda(setting: str) -> None:
    """Sample i is λ_i x_i + (1 - λ_i) x_{N-1-i} (mixup), or x_i with a box of x_{N-1-i} pasted at the same place,
    λ_i its unpasted share (cutmix), or x_i itself (λ_i = 1)."""
    _, device_mixup = mixers(setting)
    n, height, width = 64, 12, 10
    torch.manual_seed(1)
    images = torch.randn(n, 3, height, width)
    mixed = images.clone()
    lam = device_mixup._mix_elem(mixed).squeeze(1)
    partner = images.flip(0)
    kinds = {"unmixed": 0, "mixup": 0, "cutmix": 0}
    for i in range(n):
        pasted = (mixed[i] == partner[i]).all(0)
        if ((mixed[i] == images[i]).all(0) | pasted).all():  # every pixel one image's or the other's: a cutmix box
            rows, cols = pasted.any(1), pasted.any(0)
            assert torch.equal(pasted, rows[:, None] & cols[None, :]), "the pasted region is not a box"
            # (also a mixup whose lambda is within float32 rounding of 1 or 0: the box is then none or all)
            assert lam[i] == pytest.approx(1 - pasted.sum().item() / (height * width), abs=1e-6)
            if lam[i] == 1:
                kinds["unmixed"] += 1
            elif 0 < pasted.sum() < height * width:
                kinds["cutmix"] += 1
        else:
            torch.testing.assert_close(mixed[i], lam[i] * images[i] + (1 - lam[i]) * partner[i], rtol=0, atol=1e-6)
            kinds["mixup"] += 1
    mixup, cutmix, prob, _ = SETTINGS[setting]
    assert (kinds["mixup"] > 0) == (mixup > 0) and (kinds["cutmix"] > 0) == (cutmix > 0)
    assert kinds["unmixed"] > 0 or prob == 1  # (with prob 1 too: a lambda drawn as 1, a box of no area)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_targets_are_timms_mixup_target_with_the_per_sample_lambdas(setting: str) -> None:
    _, device_mixup = mixers(setting, smoothing=0.1)
    n = 16
    images, labels = torch.randn(n, 3, 12, 10), torch.randint(0, CLASSES, (n,))
    torch.manual_seed(2)
    _, targets = device_mixup(images.clone(), labels)
    torch.manual_seed(2)  # the same draws again, for their lambdas
    lam = device_mixup._mix_elem(images.clone())
    assert lam.shape == (n, 1)
    assert torch.equal(targets, mixup_target(labels, CLASSES, lam, 0.1))
    smoothed = torch.full((n, CLASSES), 0.1 / CLASSES).scatter_(1, labels[:, None], 0.9 + 0.1 / CLASSES)
    torch.testing.assert_close(targets, lam * smoothed + (1 - lam) * smoothed.flip(0))
    torch.testing.assert_close(targets.sum(1), torch.ones(n))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_per_sample_mixing_makes_no_host_sync(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every blocking call (test_host_sync's list: .item(), .tolist(), bool(), .cpu(), torch.tensor(..., device=))
    counted during one call; timm's own elem path makes its lambdas with torch.tensor(list, device=x.device)."""
    timm_mixup, device_mixup = mixers(setting)
    counter = SyncCounter()
    count_syncs(monkeypatch, counter)
    images, labels = torch.randn(8, 3, 12, 10), torch.arange(8) % CLASSES
    counter.batch = 0  # count from here
    device_mixup(images.clone(), labels)
    assert not counter.calls[0], counter.calls[0]
    timm_mixup(images.clone(), labels)
    assert any(call.startswith("torch.tensor") for call in counter.calls[0]), counter.calls[0]


def test_batch_and_pair_modes_are_timms() -> None:
    for mode in ("batch", "pair"):
        kwargs: dict[str, Any] = dict(mixup_alpha=0.2, cutmix_alpha=1.0, mode=mode, num_classes=CLASSES)
        images, labels = torch.randn(8, 3, 12, 10), torch.arange(8) % CLASSES
        np.random.seed(3)
        expected = Mixup(**kwargs)(images.clone(), labels)
        np.random.seed(3)
        got = DeviceMixup(**kwargs)(images.clone(), labels)
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_fp16_batch_is_mixed_in_its_dtype() -> None:
    _, device_mixup = mixers("both")
    images = torch.randn(8, 3, 12, 10).half()
    mixed, targets = device_mixup(images.clone(), torch.arange(8) % CLASSES)
    assert mixed.dtype == torch.float16 and torch.isfinite(targets).all()
