"""The model's convolutions in a prediction: oneDNN's, torch's own kernel is slow on thin reads."""

from __future__ import annotations


def test_inference_runs_the_convolutions_of_a_thin_read_through_onednn(checkpoint):
    """torch's own kernel for a batch of one with a small batch x channels x depth x
    height (slow_conv3d_forward) took 4.9 s of the 16 x 256 x 256 view, oneDNN 2.7 s."""
    import torch
    from torch.profiler import profile

    from napari_finetune.loading import load_checkpoint
    from napari_finetune.predict.volume import inference_mode

    model = load_checkpoint(str(checkpoint)).model
    x = torch.rand(1, 1, 16, 32, 32)
    with torch.no_grad():
        plain = model.eval()(x)
    with inference_mode(model), profile() as seen:
        fast = model(x)
    names = {e.key for e in seen.key_averages()}
    assert "aten::slow_conv3d_forward" not in names, names
    assert "aten::mkldnn_convolution" in names, names
    assert torch.allclose(plain, fast, atol=1e-4)
    model.train()  # a training step keeps torch's own path, with gradients
    model(x).sum().backward()
