"""Every knob of a fine-tuning or prediction run, with the defaults a user expects.

The widget, the CLI and the tests all build these dataclasses, so validation
lives here once: a bad value fails at construction with a message that names
the field and the fix, before any model or optimizer is built.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from napari_finetune.voxel_size import check_voxel_size

Mode = Literal["lora", "full"]
DeviceName = Literal["auto", "cpu", "cuda", "mps"]


@dataclass
class FinetuneConfig:
    """Settings of one fine-tuning run.

    Parameters
    ----------
    steps : int
        Optimizer steps to run.
    batch_size : int
        Patches per micro-batch at the start. Halved on out-of-memory.
    accumulation : int
        Micro-batches per optimizer step at the start; ``batch_size`` times
        ``accumulation`` samples make one optimizer step and stay fixed for the run.
    patch_shape : tuple of int
        Spatial patch size, ZYX for 3D models, YX for 2D ones.
    learning_rate : float
        AdamW learning rate (1e-3 suits both modes on small UNets).
    weight_decay : float
        AdamW weight decay.
    mode : {"lora", "full"}
        LoRA adapters through PEFT, or every weight trained.
    lora_rank : int
        Rank of each LoRA adapter: the inner size of its two small matrices.
    lora_alpha : float
        Scaling numerator of the LoRA adapters: their update is multiplied by
        alpha / rank.
    distillation : float
        Weight of the teacher's supervision on unpainted voxels; 0 turns it off.
    hold_other_channels : bool
        Keep channels that no correction touches close to the teacher everywhere.
    balance_classes : bool
        Weigh each painted class the same in total, whatever its voxel count
        (interiors painted in long strokes against membranes in short ones);
        off by default: on CREMI it kept more of the starting model's membrane
        but not more cells, and it lowered the demo's mitochondria (docs/benchmarks.md,
        "membrane kept").
    balance_membranes : bool
        The painted voxels of a channel whose objects role is ``boundary`` (membranes,
        from the checkpoint's roles) weigh as much in total as all other painted voxels
        together. A membrane is thin, so strokes on it are short: on CREMI 64 membrane
        voxels against 770 interior ones, and unweighted the model learned "less
        membrane" everywhere (docs/benchmarks.md, "membranes against the rest").
    distillation_check : bool
        Before step 1, measure how much of the painting the starting model gets
        right, and train without distillation when it is under half (a large shift:
        distillation would hold the model to the errors the painting corrects).
        A distillation named in ``explicit_settings`` stays. Off here, so a
        Finetuner built directly does what its config says; the widget and the
        command line turn it on.
    mixed_precision : bool
        Faster, lower-precision arithmetic on a GPU (bf16, or fp16 with loss
        scaling on older cards), checked against full precision before the first
        step; the CPU trains in full precision unless ``cpu_bf16`` is set.
    cpu_bf16 : bool
        Allow bf16 on the CPU too (faster on some CPUs; now and then a step has
        to be redone in full precision).
    device : {"auto", "cpu", "cuda", "cuda:N", "mps"}
        Where to train: "auto" takes CUDA, then MPS, then the CPU; "cuda:N" takes
        the GPU of index N.
    seed : int
        Seeds patch sampling, augmentation and adapter initialisation.
    max_grad_norm : float or None
        Clip the total gradient norm of a step to this value (fp16 gradients are
        unscaled first). None leaves the gradients as they are.
    prefetch_steps : int
        Optimizer steps whose samples a background thread draws ahead of the
        training step (0: drawn on the training thread). The samples are the
        same either way; on CUDA they are staged in pinned memory.
    validation_fraction : float
        Share of each class's painted voxels held out of training (as whole
        regions) and scored during the run; 0 trains on all of them.
    validation_every : int
        Score the held-out voxels after every so many steps (and the last one).
    keep_best : bool
        At the end of a finished run, keep the weights of the best validation
        score when they beat the last step's by more than 0.02 mean IoU (closer
        than that is the held-out strokes' noise; the export says which step).
    early_stop_checks : int
        End the run after this many checks without a better score (0: never).
    sample_cache_gib : float
        Keep the part of a store that patches can reach (around the painted
        voxels) in memory when it fits this many GiB; 0 reads every patch from
        the store.
    resume_degraded : bool
        Start from the degraded state a previous run of the checkpoint ended in
        (smaller batch, fp32, distillation dropped), so it does not run out of
        memory the same way again; False starts fresh from these settings.
    explicit_settings : tuple of str
        Fields the user set explicitly; a resumed degraded state never overrides
        them (the CLI fills it from the options given, the widget from the
        inputs changed).
    autobatch : bool or None
        Choose the micro-batch from a memory profile measured before step 1, keeping
        the samples per step. None: on for CUDA and MPS, off on the CPU, which has
        no device memory limit to measure against.
    memory_fraction : float
        Share of the free device memory autobatch may plan to use, in (0, 1]; the
        rest is headroom for fragmentation and other programs.
    memory_snapshot : str or None
        File to dump the CUDA allocator's history to at the first out-of-memory and
        at the end of the run (open it at https://pytorch.org/memory_viz). None: off.
    voxel_size : tuple of float or None
        Physical size of a voxel along each spatial axis (Z, Y, X), in the store's
        units; filled from the store's NGFF scale. When anisotropic the default
        patch is about isotropic in physical units, and the exported checkpoint
        records it. None: unknown, every axis treated alike.
    queue_timeout_s : float
        On a dask scheduler (``--scheduler``): how long a run may wait for a worker
        with a free GPU before it is given up (every device but "cpu" asks for one).
    max_send_bytes : int
        On a dask scheduler (``--scheduler``): the most bytes a run may send (the
        checkpoint, the painting and the image tiles around it); a run that would
        send more is refused before anything is sent.
    remote_grace_s : float
        On a dask scheduler (``--scheduler``): how long a worker whose client is gone
        (a laptop asleep, Wi-Fi dropped) trains on, waiting for a client to re-attach
        to the run by its id; after it, the run stops and its last weights stay on the
        worker for a client to fetch.
    """

    steps: int = 200
    batch_size: int = 4
    accumulation: int = 1
    patch_shape: tuple[int, ...] = (32, 64, 64)
    # Measured on the sample (docs/benchmarks.md, adaptation quality): a full
    # fine-tune at 1e-3 reached 97 % of a dense upper bound in 2 CPU minutes,
    # LoRA 86 % (its adapters double the cost of each conv of a small UNet),
    # and LoRA at 1e-4 barely moved the loss in 30 steps. Small UNets make the
    # full fine-tune's frozen teacher copy cheap; LoRA stays one click away.
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    mode: Mode = "full"
    lora_rank: int = 8
    # Scale alpha / rank = 8: B starts at zero and Adam moves it by about the
    # learning rate a step, so at scale 2 rank-8 adapters learnt a fraction of
    # what a full fine-tune does per step (tiny UNet, 10 steps: 28 % of its loss
    # drop; 64 % at scale 8). On the sample, 50 LoRA steps at lr 1e-3 (norms and
    # biases trained): alpha 16 -> IoU 0.848/0.804, alpha 64 -> 0.859/0.843
    # (docs/benchmarks.md, adaptation quality).
    lora_alpha: float = 64.0
    distillation: float = 0.5
    hold_other_channels: bool = True
    balance_classes: bool = False
    balance_membranes: bool = True
    distillation_check: bool = False
    mixed_precision: bool = True
    cpu_bf16: bool = False
    device: str = "auto"
    seed: int = 0
    max_grad_norm: float | None = None
    prefetch_steps: int = 2
    sample_cache_gib: float = 1.0
    validation_fraction: float = 0.1
    validation_every: int = 10
    keep_best: bool = True
    early_stop_checks: int = 0
    resume_degraded: bool = True
    explicit_settings: tuple[str, ...] = ()
    autobatch: bool | None = None
    memory_fraction: float = 0.8
    memory_snapshot: str | None = None
    voxel_size: tuple[float, ...] | None = None
    queue_timeout_s: float = 600.0
    max_send_bytes: int = 2_000_000_000
    remote_grace_s: float = 300.0

    def __post_init__(self) -> None:
        self.patch_shape = tuple(int(s) for s in self.patch_shape)
        self.voxel_size = check_voxel_size(self.voxel_size)
        self.explicit_settings = tuple(str(name) for name in self.explicit_settings)
        known = {f.name for f in fields(self)}
        unknown = sorted(set(self.explicit_settings) - known)
        if unknown:
            raise ValueError(
                f"explicit_settings names unknown fields {unknown}; use FinetuneConfig field "
                "names such as 'batch_size' or 'distillation'."
            )
        _positive_int(self, "steps")
        _positive_int(self, "batch_size")
        _positive_int(self, "accumulation")
        _positive_int(self, "lora_rank")
        _positive_int(self, "validation_every")
        _positive_int(self, "max_send_bytes")
        if not self.remote_grace_s >= 0:  # NaN too: the worker compares against it
            raise ValueError(f"remote_grace_s must be >= 0 seconds, got {self.remote_grace_s!r}; "
                             "300 lets a client re-attach within 5 minutes, 0 stops at once.")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}; "
                "0.1 holds out a tenth of the painting, 0 trains on all of it."
            )
        if int(self.early_stop_checks) != self.early_stop_checks or self.early_stop_checks < 0:
            raise ValueError(
                f"early_stop_checks must be an integer >= 0, got {self.early_stop_checks!r}; "
                "0 never stops early."
            )
        if int(self.prefetch_steps) != self.prefetch_steps or self.prefetch_steps < 0:
            raise ValueError(
                f"prefetch_steps must be an integer >= 0, got {self.prefetch_steps!r}; "
                "use 0 to draw samples on the training thread, 2 to prefetch."
            )
        self.prefetch_steps = int(self.prefetch_steps)
        if not (math.isfinite(float(self.sample_cache_gib)) and self.sample_cache_gib >= 0):
            raise ValueError(
                f"sample_cache_gib must be a number >= 0, got {self.sample_cache_gib!r}; "
                "use 0 to read every patch from the store, 1 to cache up to 1 GiB."
            )
        if not self.patch_shape or any(s < 1 for s in self.patch_shape):
            raise ValueError(
                f"patch_shape must be positive sizes, got {self.patch_shape}; "
                "use e.g. (32, 64, 64) for a 3D model or (128, 128) for a 2D one."
            )
        if not self.learning_rate > 0:
            raise ValueError(
                f"learning_rate must be > 0, got {self.learning_rate}; 1e-3 is a good start."
            )
        for name in ("learning_rate", "weight_decay", "lora_alpha", "distillation"):
            if not math.isfinite(float(getattr(self, name))):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}.")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}.")
        if self.mode not in ("lora", "full"):
            raise ValueError(f"mode must be 'lora' or 'full', got {self.mode!r}.")
        if self.distillation < 0:
            raise ValueError(
                f"distillation must be >= 0, got {self.distillation}; use 0 to turn it off."
            )
        if self.max_grad_norm is not None and not (
            math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0
        ):
            raise ValueError(
                f"max_grad_norm must be a positive number or None (no clipping), got "
                f"{self.max_grad_norm}; 1.0 is a common choice."
            )
        if self.autobatch is not None and not isinstance(self.autobatch, bool):
            raise ValueError(
                f"autobatch must be True, False or None (on for CUDA/MPS, off on the CPU), "
                f"got {self.autobatch!r}."
            )
        if not (
            isinstance(self.memory_fraction, (int, float))
            and not isinstance(self.memory_fraction, bool)
            and 0 < float(self.memory_fraction) <= 1
        ):
            raise ValueError(
                f"memory_fraction must be a number in (0, 1], got {self.memory_fraction!r}; "
                "0.8 leaves a fifth of the free memory as headroom."
            )
        self.memory_fraction = float(self.memory_fraction)
        if self.memory_snapshot is not None:
            if not str(self.memory_snapshot).strip():
                raise ValueError(
                    "memory_snapshot must be a file path or None, got an empty string; "
                    "use e.g. memory.pickle."
                )
            self.memory_snapshot = str(self.memory_snapshot)
        if self.device not in ("auto", "cpu", "cuda", "mps") and not str(
            self.device
        ).startswith("cuda:"):
            raise ValueError(
                f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {self.device!r}."
            )

    def autobatch_on(self, device_type: str) -> bool:
        """Whether autobatch runs on a device of this type ("cuda", "mps", "cpu")."""
        if self.autobatch is None:
            return device_type in ("cuda", "mps")
        return self.autobatch

    @property
    def samples_per_step(self) -> int:
        """Samples in one optimizer step; fixed for the whole run."""
        return self.batch_size * self.accumulation

    def to_dict(self) -> dict[str, Any]:
        """Plain-types copy, safe for ``torch.save(..., weights_only)`` round trips."""
        d = asdict(self)
        d["patch_shape"] = list(self.patch_shape)
        d["explicit_settings"] = list(self.explicit_settings)
        d["voxel_size"] = None if self.voxel_size is None else list(self.voxel_size)
        return d


@dataclass
class PredictConfig:
    """Settings of blockwise prediction.

    Parameters
    ----------
    block_shape : tuple of int
        Core block computed per model call (before the halo is added).
    halo : tuple of int
        Context added on each side of a block and trimmed from the output.
    batch_size : int
        Blocks per model call.
    device : {"auto", "cpu", "cuda", "cuda:N", "mps"}
        Where to predict: "auto" takes CUDA, then MPS, then the CPU; "cuda:N" takes
        the GPU of index N.
    """

    # Measured (benchmarks/bench_predict.py): 64x128x128 was the fastest block on
    # the CPU (0.86-0.90 of one whole-volume call) with the fewest GroupNorm flips.
    block_shape: tuple[int, ...] = (64, 128, 128)
    halo: tuple[int, ...] = (8, 16, 16)
    batch_size: int = 1
    device: str = "auto"

    def __post_init__(self) -> None:
        self.block_shape = tuple(int(s) for s in self.block_shape)
        self.halo = tuple(int(s) for s in self.halo)
        if len(self.block_shape) != len(self.halo):
            raise ValueError(
                f"block_shape {self.block_shape} and halo {self.halo} must have the same "
                "number of axes."
            )
        if any(s < 1 for s in self.block_shape) or any(h < 0 for h in self.halo):
            raise ValueError("block_shape must be positive and halo non-negative.")
        _positive_int(self, "batch_size")


def _positive_int(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    setattr(obj, name, int(value))
