"""How one optimizer step's samples are cut into micro-batches.

Kept apart so that the step, the BatchNorm floor and autobatch agree on the
same cut without importing each other.
"""

from __future__ import annotations

import math


def split_sizes(n: int, batch_size: int) -> list[int]:
    """Micro-batch sizes for ``n`` samples, none over ``batch_size``, none lost.

    Balanced: 5 at most 3 -> [3, 2]; 8 at most 3 -> [3, 3, 2].
    """
    if n <= 0:
        return []
    parts = math.ceil(n / batch_size)
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


__all__ = ["split_sizes"]
