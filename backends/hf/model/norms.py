"""RMSNorm as Llama computes it, with the fewest ops this machine allows.

transformers' ``LlamaRMSNorm`` normalises in fp32 and rounds to the model dtype before
the weight multiply. ``F.rms_norm`` on a half-precision CPU tensor accumulates in fp32
and rounds once, which gives the same bits while skipping the upcast and downcast
copies (two ops and two tensor copies per norm, 61 norms per SmolLM2 step). Whether a
device and dtype really give the same bits is probed once at construction, so a backend
whose kernel rounds differently keeps the explicit upcast.

Stateless after construction; safe to share.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_PROBE_ROWS = 7  # odd, to catch a vectorised tail handled differently


def upcast_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference: normalise in fp32, round to ``x``'s dtype, scale by ``weight``."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype) * weight


def direct_is_exact(hidden: int, eps: float, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``F.rms_norm`` straight on ``dtype`` gives ``upcast_rms_norm``'s bits here."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = (torch.randn(_PROBE_ROWS, hidden, generator=gen, device=device) * 4).to(dtype)
    weight = torch.randn(hidden, generator=gen, device=device).to(dtype)
    direct = F.rms_norm(x, (hidden,), None, eps) * weight
    return bool(torch.equal(direct, upcast_rms_norm(x, weight, eps)))


class RMSNorm:
    """``norm(x, weight)`` over the last ``hidden`` features, fp32-exact for half
    precision (see the module docstring); fp32 models use the fused weighted kernel."""

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype, device: torch.device):
        self.hidden = hidden
        self.eps = eps
        self.upcast = dtype != torch.float32
        self.direct = self.upcast and direct_is_exact(hidden, eps, dtype, device)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if not self.upcast:
            return F.rms_norm(x, (self.hidden,), weight, self.eps)
        if self.direct:
            return F.rms_norm(x, (self.hidden,), None, self.eps) * weight
        return upcast_rms_norm(x, weight, self.eps)


class OffsetRMSNorm:
    """Gemma's RMSNorm: ``x_hat * (1 + w)`` computed in fp32, rounded once to ``x``'s
    dtype (unlike Llama's, which rounds ``x_hat`` before the product). Takes the fp32
    ``1 + w`` prepared at load (``offset_weight``). Stateless; safe to share."""

    def __init__(self, hidden: int, eps: float):
        self.hidden = hidden
        self.eps = eps

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.hidden,), weight, self.eps)
        return F.rms_norm(x.float(), (self.hidden,), weight, self.eps).to(x.dtype)


def offset_weight(weight: torch.Tensor) -> torch.Tensor:
    """The fp32 ``1 + w`` an ``OffsetRMSNorm`` multiplies by."""
    return 1.0 + weight.detach().float()
