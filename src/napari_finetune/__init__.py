"""napari-finetune: correct a pretrained segmentation UNet on your own volume.

Importing the package is cheap on purpose (no torch, no napari, no PEFT): the
CLI's ``--help`` and napari's plugin discovery should not wait for them.
"""

__version__ = "0.1.0"
