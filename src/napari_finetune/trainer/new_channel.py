"""A new channel's first weights: fitted on the painted voxels before the first step.

A channel added for a new structure starts with a zero row in the output layer
(:mod:`napari_finetune.model.add_channel`). AdamW moves each weight by about the
learning rate per step, so from there the row needs thousands of steps to say
anything (measured on the sample model: after 6 steps at 3e-4 its probability had
moved from 0.0182 to 0.0183), while every shared weight drifts by the same amount
each step, and the old channels with it. Before the run, the new row is therefore
fitted as a logistic regression on the output layer's input at the painted voxels
(the model's own features, frozen): positive where the channel is painted,
negative where background or another channel is. Only the new rows change; the
old channels' outputs stay exactly the starting model's. A channel with weights of
its own (napari-finetune's UNet, :func:`~napari_finetune.model.add_channel.channel_rows`)
has its own output row, fitted the same way on what that row reads: the decoder's
features and its own block's (as first drawn).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from napari_finetune.data.sampling import PatchSampler
from napari_finetune.model.add_channel import channel_rows, output_channel_count
from napari_finetune.model.modes import evaluating

# At most this many painted voxels go into the fit (a fit of a few thousand rows of
# features takes well under a second on a CPU).
MAX_VOXELS = 20_000
FIT_ITERATIONS = 100
ROUNDS = 4
# A little weight decay keeps a perfectly separable painting from growing the row
# without bound (a logit of 50 on a voxel one step further is not what it learnt).
L2 = 1e-3


def fit_new_channels(
    model: nn.Module, sampler: PatchSampler, taught: int, batch_size: int, device: torch.device
) -> str:
    """Fit the output layer's rows of channels ``taught..`` on the painted voxels.

    Parameters
    ----------
    model : torch.nn.Module
        The plain model (not yet wrapped with LoRA), on ``device``.
    sampler : PatchSampler
        The run's patches; its random state is restored afterwards, so the run
        draws the same patches as without the fit.
    taught : int
        The channels the starting model had; the ones after are fitted.
    batch_size : int
        Patches per forward pass (:data:`ROUNDS` of them are drawn).
    device : torch.device
        Where the model is.

    Returns
    -------
    str
        One line for the run's log ("" when nothing was fitted: no pointwise output
        layer, or no painted voxel of a new channel's label).
    """
    rows = channel_rows(model, range(taught, output_channel_count(model)))
    layers: dict[str, nn.Module] = {}
    for name, layer, _row in rows:
        if not isinstance(layer, nn.Conv1d | nn.Conv2d | nn.Conv3d) or any(
            k != 1 for k in layer.kernel_size
        ) or any(s != 1 for s in layer.stride):
            return ""  # a wider kernel reads neighbours: a per-voxel fit is not its weights
        layers[name] = layer
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in layers}
    drawn: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_pre_hook(
            lambda _m, args, _n=name: captured[_n].append(args[0].detach())
        )
        for name, layer in layers.items()
    ]
    state = sampler.get_state()
    try:
        # Batches of the run's micro-batch size: a forward without gradients that fits.
        with evaluating(model), torch.no_grad():
            for _ in range(ROUNDS):
                images, labels = sampler.sample(batch_size)
                model(torch.from_numpy(np.ascontiguousarray(images)).to(device))
                drawn.append(torch.from_numpy(np.ascontiguousarray(labels)).reshape(-1))
    finally:
        for hook in hooks:
            hook.remove()
        sampler.set_state(state)
    flat = torch.cat(drawn).to(device)
    painted = flat > 0
    y_all = flat[painted]
    keep = None
    if len(y_all) > MAX_VOXELS:
        keep = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(0))[
            :MAX_VOXELS
        ].to(device)
    lines = []
    for channel, (name, layer, row) in zip(range(taught, taught + len(rows)), rows,
                                           strict=True):
        assert isinstance(layer, nn.Conv1d | nn.Conv2d | nn.Conv3d)
        features = torch.cat([c.float().movedim(1, -1).reshape(-1, c.shape[1])
                              for c in captured[name]])
        x, y = features[painted], y_all
        if keep is not None:
            x, y = x[keep], y[keep]
        target = (y == channel + 2).float()
        if not target.any() or target.all():
            continue  # nothing to tell apart: the row stays as it was
        weight, bias, before, after = _logistic(x, target, layer, row)
        with torch.no_grad():
            layer.weight[row].view(-1).copy_(weight)
            if layer.bias is not None:
                layer.bias[row] = bias
        lines.append(f"channel {channel} fitted on {len(y)} painted voxels of {name} "
                     f"(loss {before:.3f} -> {after:.3f})")
    return "; ".join(lines)


def _logistic(
    x: torch.Tensor, target: torch.Tensor, layer: nn.Conv1d | nn.Conv2d | nn.Conv3d, channel: int
) -> tuple[torch.Tensor, float, float, float]:
    """Logistic regression of ``target`` on ``x`` from the layer's current row (L-BFGS)."""
    weight = layer.weight[channel].detach().reshape(-1).float().clone().requires_grad_(True)
    start = float(layer.bias[channel].detach()) if layer.bias is not None else 0.0
    bias = torch.tensor(start, device=x.device, requires_grad=True)
    params = [weight, bias] if layer.bias is not None else [weight]
    optimizer = torch.optim.LBFGS(params, max_iter=FIT_ITERATIONS, line_search_fn="strong_wolfe")

    def loss_of() -> torch.Tensor:
        logits = x @ weight + bias
        return nn.functional.binary_cross_entropy_with_logits(logits, target)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_of() + L2 * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        with torch.no_grad():
            before = float(loss_of())
        optimizer.step(closure)
        with torch.no_grad():
            after = float(loss_of())
    return weight.detach().to(layer.weight.dtype), float(bias.detach()), before, after
