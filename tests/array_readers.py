"""Array-likes that stand in for a store in tests: they record what is read from them."""

from __future__ import annotations

import numpy as np


class CountingReader:
    """Array-like that records the size of every region read from it.

    Converting it whole to numpy fails the test: a blockwise reader must slice.
    """

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.ndim = array.ndim
        self.reads: list[int] = []

    def __getitem__(self, index):
        part = self.array[index]
        self.reads.append(int(part.size))
        return part

    def __array__(self, *args, **kwargs):  # a whole read would show up here
        raise AssertionError("the whole image was converted to numpy")
