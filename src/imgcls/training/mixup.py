"""Per-sample mixup / cutmix (recipe.mixup_mode=elem, the TF1 and TF2 recipes) drawn and applied on the batch's device.

timm's Mixup(mode="elem") draws the lambdas with numpy, mixes sample by sample in a Python loop and hands the
lambdas to the GPU with torch.tensor(list, device=...): a host-to-device copy from pageable memory that waits for
the GPU's queue, at every training step. Here the same distributions are drawn with torch on the batch's device and
every sample is mixed at once, so the step never waits on the host. mode="batch" and "pair" are timm's own code.
"""

from __future__ import annotations

import torch
from timm.data import Mixup
from torch.distributions import Beta


class DeviceMixup(Mixup):
    """timm's Mixup whose per-sample mode draws each sample's lambda like timm's `_params_per_elem` (cutmix instead
    of mixup with probability switch_prob when both are on; lambda 1, no mixing, with probability 1 - prob; else
    Beta(alpha, alpha)) and mixes like timm's `_mix_elem`: sample i with sample N-1-i, cutmix boxes as timm's
    `cutmix_bbox_and_lam` makes them, lambda corrected to a box's area. Random numbers come from the torch
    generator of the batch's device (seeded and checkpointed like the rest: imgcls/seeding.py), not numpy's."""

    def _params_per_elem_on(self, batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(lambda float32 [N], use_cutmix bool [N]) on `device`: timm's `_params_per_elem` without numpy."""
        lam = torch.ones(batch_size, device=device)
        use_cutmix = torch.zeros(batch_size, dtype=torch.bool, device=device)
        if not self.mixup_enabled:
            return lam, use_cutmix
        if self.mixup_alpha > 0.0 and self.cutmix_alpha > 0.0:
            use_cutmix = torch.rand(batch_size, device=device) < self.switch_prob
            cut = _beta(self.cutmix_alpha, batch_size, device)
            lam_mix = torch.where(use_cutmix, cut, _beta(self.mixup_alpha, batch_size, device))
        elif self.mixup_alpha > 0.0:
            lam_mix = _beta(self.mixup_alpha, batch_size, device)
        elif self.cutmix_alpha > 0.0:
            use_cutmix = torch.ones(batch_size, dtype=torch.bool, device=device)
            lam_mix = _beta(self.cutmix_alpha, batch_size, device)
        else:
            raise ValueError("one of mixup_alpha > 0, cutmix_alpha > 0 or cutmix_minmax is needed")
        return torch.where(torch.rand(batch_size, device=device) < self.mix_prob, lam_mix, lam), use_cutmix

    def _boxes(
        self, lam: torch.Tensor, height: int, width: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-sample (yl, yh, xl, xh), int64 [N]: timm's rand_bbox / rand_bbox_minmax, one box per lambda."""
        n, device = len(lam), lam.device
        if self.cutmix_minmax is not None:
            low, high = self.cutmix_minmax
            cut_h = torch.randint(int(height * low), int(height * high), (n,), device=device)
            cut_w = torch.randint(int(width * low), int(width * high), (n,), device=device)
            yl = _randint_below(height - cut_h + 1)
            xl = _randint_below(width - cut_w + 1)
            return yl, yl + cut_h, xl, xl + cut_w
        ratio = torch.sqrt(1.0 - lam)
        cut_h, cut_w = (height * ratio).long(), (width * ratio).long()  # int(): truncation, as timm
        cy = torch.randint(0, height, (n,), device=device)
        cx = torch.randint(0, width, (n,), device=device)
        yl = (cy - cut_h // 2).clamp(0, height)
        yh = (cy + (cut_h + 1) // 2).clamp(0, height)
        xl = (cx - cut_w // 2).clamp(0, width)
        xh = (cx + (cut_w + 1) // 2).clamp(0, width)
        return yl, yh, xl, xh

    def _mix_elem(self, x: torch.Tensor) -> torch.Tensor:
        """Mixes x (N, C, H, W) in place, as timm does; returns the per-sample lambdas, shape [N, 1] in x's dtype
        (what timm's mixup_target takes)."""
        n, height, width = len(x), x.shape[-2], x.shape[-1]
        lam, use_cutmix = self._params_per_elem_on(n, x.device)
        active = lam != 1.0  # timm leaves a sample whose lambda is 1 alone (no box either)
        flipped = x.flip(0)
        mixed = x
        if self.mixup_alpha > 0.0:
            blend = active & ~use_cutmix
            shape = (n, *([1] * (x.dim() - 1)))
            # In x's dtype, as timm's Python-number lambda is: an fp16 batch is not blended in float32 copies.
            own, partner = lam.to(x.dtype).view(shape), (1.0 - lam).to(x.dtype).view(shape)
            mixed = torch.where(blend.view(shape), x * own + flipped * partner, x)
        if self.cutmix_alpha > 0.0:
            yl, yh, xl, xh = self._boxes(lam, height, width)
            cut = active & use_cutmix
            rows = torch.arange(height, device=x.device)
            cols = torch.arange(width, device=x.device)
            in_rows = (rows >= yl[:, None]) & (rows < yh[:, None]) & cut[:, None]
            in_cols = (cols >= xl[:, None]) & (cols < xh[:, None])
            box = (in_rows[:, :, None] & in_cols[:, None, :]).unsqueeze(1)  # N, 1, H, W
            mixed = torch.where(box, flipped, mixed)
            if self.correct_lam or self.cutmix_minmax is not None:
                # float64, then float32, as timm's numpy arithmetic: float32 throughout lands one ulp off.
                area = ((yh - yl) * (xh - xl)).double()
                lam = torch.where(cut, (1.0 - area / float(height * width)).float(), lam)
        if mixed is not x:
            x.copy_(mixed)
        return lam.to(x.dtype).unsqueeze(1)


def _beta(alpha: float, count: int, device: torch.device) -> torch.Tensor:
    # float64, then float32, as timm's numpy draws: torch keeps a float32 draw below 1, where numpy's rounds to
    # exactly 1 (no mixing) about 1.7% of the time at alpha 0.2. validate_args=False: torch's argument checks test
    # their result with a Python `if` (a host sync on a GPU).
    concentration = torch.full((), float(alpha), dtype=torch.float64, device=device)
    return Beta(concentration, concentration, validate_args=False).sample((count,)).float()


def _randint_below(high: torch.Tensor) -> torch.Tensor:
    """A uniform integer in [0, high) per element (torch.randint takes one bound for all)."""
    drawn = (torch.rand(high.shape, device=high.device) * high).long()
    return torch.minimum(drawn, high - 1)  # a float32 product can round up to `high`
