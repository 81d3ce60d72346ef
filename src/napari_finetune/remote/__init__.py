"""Fine-tuning on a dask.distributed worker (a GPU server, a cluster) while napari stays local.

:class:`~napari_finetune.remote.finetuner.RemoteFinetuner` is a
:class:`~napari_finetune.trainer.loop.Finetuner` whose :meth:`run` happens on a
worker: it checks the scheduler, the workers' resources and versions before
anything starts, ships the checkpoint, the painting and only the image tiles
the patches can reach (:mod:`~napari_finetune.remote.tiles`), and yields the
worker's :class:`~napari_finetune.trainer.status.Status` events as they come
(:mod:`~napari_finetune.remote.messages`). Its weights are the last ones the
worker sent back, so Predict and Export work as after a local run, and a
worker that dies leaves them. The worker side is
:func:`~napari_finetune.remote.worker.train_on_worker`, one dask task.

dask ships pickled functions: the cluster must be yours.
"""
