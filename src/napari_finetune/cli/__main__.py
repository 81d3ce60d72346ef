"""``python -m napari_finetune.cli``: the same as the ``napari-finetune`` command."""

import sys

from napari_finetune.cli import main

sys.exit(main())
