"""The user's work and the actions on it, without Qt (see :mod:`.session`).

``Session`` (:mod:`.session`) runs the jobs of :mod:`.jobs` and :mod:`.derived`
through an injected runner (:mod:`.runner`); the widget in ``napari_finetune._qt``
runs the same jobs. This package imports no Qt.
"""
