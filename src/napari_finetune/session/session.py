"""The user's work and the actions on it, without Qt: a :class:`Session`.

A Session holds what the user chose (image, checkpoint, corrections, roles,
the run's settings) and what came of it (the trainer of the last run, its
status and history, the last prediction, objects, suggestion, export). Each
action (:meth:`Session.predict`, :meth:`~Session.finetune`, :meth:`~Session.stop`,
:meth:`~Session.export`, :meth:`~Session.save_predictions`,
:meth:`~Session.objects`, :meth:`~Session.suggest`,
:meth:`~Session.export_bioimageio`) checks its inputs, marks
the session :class:`Busy` and starts a job (:mod:`napari_finetune.session.jobs`)
through the :class:`~napari_finetune.session.runner.JobRunner` it was given.
An action asked while another runs is refused: ``events.refused`` says why,
and the action returns False. How every action ended (done, stopped, failed
with a one-line reason) comes through ``events.ended``.

The callbacks arrive where the runner delivers them (the calling thread for
the inline runner, napari's main thread for the thread runner), so the
Session is only ever changed from one thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from psygnal import Signal, SignalGroup

from napari_finetune.config import FinetuneConfig
from napari_finetune.errors import first_line
from napari_finetune.session import derived, jobs
from napari_finetune.session.checkpoint import (
    CheckpointInfo,
    CheckpointUnusable,
    Untrusted,
    info_job,
    no_roles_message,
    refusal,
)
from napari_finetune.session.estimate import RunEstimate, StepTimes, estimate, unknown_text
from napari_finetune.session.events import (
    Event,
    Placement,
    Preview,
    RegionPredicted,
    RunStatus,
    TrainerReady,
)
from napari_finetune.session.kept import KeptWeights
from napari_finetune.session.runner import JobCallbacks, JobHandle, JobRunner
from napari_finetune.session.saving import (
    CorrectionsFailed,
    CorrectionsSaved,
    corrections_target,
    save_corrections_locked,
)
from napari_finetune.session.viewer import LayerKind, ViewerPort

if TYPE_CHECKING:
    from napari_finetune.objects import ChannelRole, RolesFromPainting
    from napari_finetune.session.structure import StructureAdded
    from napari_finetune.session.work import Job
    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.status import Status
    from napari_finetune.uncertainty import Suggestion

R = TypeVar("R")  # what a job returns, handed to its on_result


def _nothing() -> None:
    """A job's body that does nothing (see :meth:`Session.release_trainer`)."""


class Busy(Enum):
    """The action a session is busy with (one at a time)."""

    PREDICT = "predict"
    TRAIN = "fine-tune"
    EXPORT = "export"
    SAVE = "save predictions"
    OBJECTS = "objects"
    SUGGEST = "suggest where to paint"
    BIOIMAGEIO = "bioimage.io export"
    STRUCTURE = "add a structure"
    # A job's result going into the viewer: a front end adds its layers one per event-loop
    # turn (two at once stall napari) and holds the session (Session.hold) meanwhile, so
    # no other action starts until they are there.
    SHOW = "show the results"


class Outcome(Enum):
    """How an action ended."""

    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class ActionEnd:
    """One action's end: which, how, and why (the failure's first line; how a run ended)."""

    action: Busy
    outcome: Outcome
    reason: str = ""


class SessionEvents(SignalGroup):
    """What a :class:`Session` signals (psygnal, which napari ships)."""

    busy = Signal(object)  # Busy, or None when the session is free again
    job_event = Signal(object)  # every event of the running job, in order
    status = Signal(object)  # each Status of a run (probe, step, recovery, end)
    refused = Signal(str)  # an action asked while another ran, or without its inputs
    ended = Signal(object)  # ActionEnd, after every action that was started
    warmed = Signal()  # a warm-up ended (done or failed: its failure came through failed)
    failed = Signal(str)  # a background job's failure, one line (no action's)
    # Reading a checkpoint (read_checkpoint): its CheckpointInfo; the Untrusted request a
    # front end answers with answer_trust; or CheckpointUnusable, why no model came.
    checkpoint_read = Signal(object)
    trust_asked = Signal(object)
    checkpoint_unusable = Signal(object)
    # The autosave (save_corrections): CorrectionsSaved, or CorrectionsFailed with where the
    # next save goes.
    corrections_saved = Signal(object)
    corrections_failed = Signal(object)
    # The weights a remote run kept beside the store opened (open_store): KeptWeights,
    # offered to use or set aside; None when no offer stands (used, set aside, a run began).
    kept_weights = Signal(object)
    # Where a remote run trains, or what it waits for (a line; see Session.placement).
    placement = Signal(str)


@dataclass
class Session:
    """The user's work and the actions the widget offers, run by an injected runner.

    Parameters
    ----------
    runner : JobRunner
        Runs each action's job (inline here, a thread in napari, a cluster).
    viewer : ViewerPort, optional
        Where results are shown and the previewed region is read; None shows nothing.
    """

    runner: JobRunner
    viewer: ViewerPort | None = None
    # The raw volume (numpy, zarr or dask), ZYX or YX; an AxesImage with channels or time.
    image: Any = None
    checkpoint: str | None = None  # the starting model's path
    info: CheckpointInfo | None = None  # what read_checkpoint read of it (None meanwhile)
    trust: tuple[str, ...] = ()  # factories the user trusted for that file
    corrections: np.ndarray | None = None  # 0 unpainted, 1 background, k >= 2 channel k - 2
    store: str | None = None  # the image's OME-Zarr store: corrections and predictions go there
    channel_names: list[str] = field(default_factory=list)
    channel_colors: list[str] = field(default_factory=list)
    roles: dict[str, ChannelRole] = field(default_factory=dict)
    # Why the roles cannot be used ('' when they can): the editor holds a value no role may
    # have, and ``roles`` the last valid ones, which a package must not carry as if chosen.
    roles_error: str = ""
    # The role parameters the user set, per channel ({"nuclei": {"min_size"}}): Objects
    # never estimates these from the painting (the front end fills it from its editor).
    roles_set: dict[str, set[str]] = field(default_factory=dict)
    config: FinetuneConfig = field(default_factory=FinetuneConfig)
    preview_interval_s: float = 0.0  # 0: no previews during a run
    # Where a run trains: None here, else a dask scheduler's address (its worker trains,
    # the weights come back) and, for TLS, the CA, certificate and key files.
    scheduler: str | None = None
    tls_files: tuple[str, str, str] | None = None
    # Asked before a run on a plain tcp:// scheduler of another machine, once per address
    # (its warning line; True goes on, remembered in ``unencrypted_ok``); None: not asked.
    confirm_unencrypted: Callable[[str, str], bool] | None = None
    unencrypted_ok: set[str] = field(default_factory=set)
    # The region on screen when no viewer port says it (the widget keeps it as the camera
    # moves and shows the previews itself); a run's previews are of it.
    region: tuple[slice, ...] | None = None
    # The region on screen itself, no context around it (the slice of a 2D view): a
    # prediction's first part; None: ``region`` (or the viewer port's) is predicted first.
    view: tuple[slice, ...] | None = None
    # What came of the actions.
    trainer: Finetuner | None = None  # the last run's, kept for Predict and Export
    status: Status | None = None  # the last run's latest event
    history: list[Status] = field(default_factory=list)  # every event of the last run
    prediction: jobs.Prediction | None = None
    found_objects: dict[str, derived.ChannelObjects] = field(default_factory=dict)
    # The roles the last Objects used (seed distance, min size from the painting where
    # the user set none) and where each value came from; Export records them.
    roles_found: RolesFromPainting | None = None
    suggestion: Suggestion | None = None
    suggested: list[tuple[slice, ...]] = field(default_factory=list)
    exported: str | None = None
    saved: list[str] = field(default_factory=list)  # the labels the last save wrote
    package: str | None = None  # the last bioimage.io package written
    added: StructureAdded | None = None  # the last structure added (its new checkpoint)
    last_end: ActionEnd | None = None
    # What a remote run cut short kept beside the store (open_store found it), until used
    # or set aside; None when nothing is offered.
    kept: KeptWeights | None = field(default=None, init=False)
    # Where the last remote run trains ("the dask worker ADDR (host H, device D)") or what
    # it waits for while queued; None before a remote run says either.
    placement: str | None = field(default=None, init=False)
    # Seconds per step measured here (the last runs, a timed step): the next run's estimate.
    step_times: StepTimes = field(default_factory=StepTimes)
    events: SessionEvents = field(default_factory=SessionEvents, init=False, repr=False)
    warming: int = field(default=0, init=False)  # warm-ups under way (see warm_up)
    _busy: Busy | None = field(default=None, init=False, repr=False)
    _handle: JobHandle | None = field(default=None, init=False, repr=False)
    _action: int = field(default=0, init=False, repr=False)  # which start is the latest
    _stop_asked: bool = field(default=False, init=False, repr=False)
    # Set by Stop during a run: a preview being predicted ends at the model's next layer.
    _run_stop: threading.Event = field(default_factory=threading.Event, init=False,
                                       repr=False)
    # Set by Stop during a prediction: its job ends before the model's next layer, keeping
    # the blocks it wrote.
    _predict_stop: threading.Event = field(default_factory=threading.Event, init=False,
                                           repr=False)
    _uncertainty: tuple[tuple[str, int, int], np.ndarray] | None = field(
        default=None, init=False, repr=False)
    _run_key: tuple[str, str] = field(default=("auto", "full"), init=False, repr=False)
    _reading: str | None = field(default=None, init=False, repr=False)  # the file asked last
    _held: Busy | None = field(default=None, init=False, repr=False)  # see hold()
    _looking: int = field(default=0, init=False, repr=False)  # which open_store is the latest

    @property
    def busy(self) -> Busy | None:
        """The action running now, or None."""
        return self._busy

    def _set_busy(self, busy: Busy | None) -> None:
        if busy is not self._busy:
            self._busy = busy
            self.events.busy.emit(busy)

    # -- starting and ending an action ---------------------------------------------------
    def _refuse(self, reason: str) -> bool:
        self.events.refused.emit(reason)
        return False

    def _free(self, action: Busy) -> str:
        """Why ``action`` cannot start now ('' when it can: a hold of it, its own)."""
        if self._busy is not None and not (self._held is action and self._busy is action):
            return (f"Cannot {action.value}: busy with {self._busy.value}; wait for it to end"
                    + (" or press Stop." if self._busy is Busy.TRAIN else "."))
        return ""

    def _start(
        self, action: Busy, job: Job[R], on_result: Callable[[R], None],
        on_event: Callable[[Event], None] | None = None,
    ) -> bool:
        self._action += 1
        self._held = None  # the action takes over a hold of it
        number, failure = self._action, list[str]()
        self._stop_asked = False
        self._set_busy(action)

        def event(e: Event) -> None:
            self.events.job_event.emit(e)
            if on_event is not None:
                on_event(e)

        def finished(stopped: bool) -> None:
            if number == self._action:
                self._handle = None
            if failure:
                end = ActionEnd(action, Outcome.FAILED, failure[0])
            elif stopped or self._run_stopped(action):
                end = ActionEnd(action, Outcome.STOPPED, self._stopped_reason(action))
            else:
                end = ActionEnd(action, Outcome.DONE, self._done_reason(action))
            self.last_end = end
            self._set_busy(None)
            self.events.ended.emit(end)

        def started(handle: JobHandle) -> None:
            self._handle = handle

        callbacks: JobCallbacks[R] = JobCallbacks(
            on_started=started, on_event=event, on_result=on_result,
            on_error=lambda exc: failure.append(f"{action.value} failed: {first_line(exc)}"),
            on_finished=finished,
        )
        self.runner.start(job, callbacks)
        return True

    def _run_stopped(self, action: Busy) -> bool:
        if action is Busy.PREDICT:
            # A Stop that came after the last block stopped nothing: the prediction is
            # whole, and saying "stopped" of it would be false.
            return self._predict_stop.is_set() and (
                self.prediction is None or not self.prediction.complete)
        if action is not Busy.TRAIN:
            return False
        if self.status is not None and self.status.kind == "stopped":
            return True
        # A remote run stopped while queued ends with no "stopped" status of its own (no
        # worker ran it): a Stop before its end is what ended it, not a finish.
        return self._stop_asked and (self.status is None or self.status.kind != "finished")

    def _stopped_reason(self, action: Busy) -> str:
        if action is Busy.PREDICT and self.prediction is not None \
                and not self.prediction.complete:
            return "prediction stopped; the blocks predicted so far are kept"
        if action is not Busy.TRAIN:
            return f"{action.value} stopped before its end; nothing of it was kept"
        if self.trainer is None or self.trainer.steps_done == 0:
            return "stopped before the first step"
        return (f"stopped after step {self.trainer.steps_done} of {self.config.steps}; "
                "the weights of that step are kept")

    def _done_reason(self, action: Busy) -> str:
        if action is Busy.TRAIN and self.status is not None:
            return self.status.message
        if action is Busy.EXPORT:
            return f"exported {self.exported}"
        if action is Busy.STRUCTURE and self.added is not None:
            return self.added.describe()
        return ""

    def hold(self, busy: Busy) -> bool:
        """Keep the session busy with ``busy`` for a front end's own part of an action:
        its results going into the viewer (:attr:`Busy.SHOW`), or the layers a run needs
        before it starts (:attr:`Busy.TRAIN`, which :meth:`finetune` then takes over).

        Refused like an action while another runs; :meth:`release` ends it. One
        place says what the session is busy with, whoever does the work.
        """
        if reason := self._free(busy):
            return self._refuse(reason)
        self._held = busy
        self._set_busy(busy)
        return True

    def release(self, busy: Busy) -> None:
        """End a :meth:`hold` of ``busy`` (nothing when the session no longer holds it)."""
        if self._held is busy:
            self._held = None
            if self._busy is busy:
                self._set_busy(None)

    def stop(self) -> None:
        """End the running action: a run after its current step (its weights kept),
        any other job at its next event."""
        self._stop_asked = True
        if self._busy is Busy.TRAIN:
            self._run_stop.set()  # a preview being predicted ends at its next layer
        if self._busy is Busy.TRAIN and self.trainer is not None:
            self.trainer.stop()  # the run yields "stopped" and ends on its own
        elif self._busy is Busy.PREDICT:
            self._predict_stop.set()  # ends before the next layer; the blocks written are kept
        elif self._handle is not None:
            self._handle.stop()

    # -- background jobs: no action, never busy, never refused -----------------------------
    def _background(
        self, job: Job[R], what: str, on_result: Callable[[R], None] | None = None,
        on_finished: Callable[[], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        """Run ``job`` through the runner beside the actions (so a closing front end ends
        and waits for it with theirs); a failure's one line comes through ``failed``, or
        goes to ``on_error`` when given."""
        def failed(exc: Exception) -> None:
            self.events.failed.emit(f"{what}: {first_line(exc)}")

        self.runner.start(job, JobCallbacks(
            on_event=self.events.job_event.emit,
            on_result=on_result if on_result is not None else (lambda _: None),
            on_error=on_error if on_error is not None else failed,
            on_finished=lambda _stopped: on_finished() if on_finished is not None else None,
        ))

    def read_checkpoint(self, path: str, trust: tuple[str, ...] = ()) -> None:
        """Read ``path``'s channels, colours and roles through the runner (never busy: the
        user paints meanwhile); a later call for another file makes this one's answer moot.

        Its end is one event: ``checkpoint_read`` (the :class:`CheckpointInfo`, also
        kept as :attr:`info`, :attr:`checkpoint`, :attr:`trust` and the channels),
        ``trust_asked`` (an :class:`Untrusted` request: its model code is not on the
        allow-list, nothing of it was imported; answer with :meth:`answer_trust`) or
        ``checkpoint_unusable`` (a :class:`CheckpointUnusable` with the reason).

        Parameters
        ----------
        path : str
            The checkpoint file (or bioimage.io package).
        trust : tuple of str
            Model factories the user trusted for this file.
        """
        self._reading, self.info = path, None

        def read(result: CheckpointInfo | Untrusted) -> None:
            if path != self._reading:
                return  # another file was chosen meanwhile
            if isinstance(result, Untrusted):
                self.events.trust_asked.emit(result)  # still reading: the answer decides
                return
            self._reading, self.info = None, result
            self.checkpoint, self.trust = result.path, result.trust
            self.channel_names, self.channel_colors = (list(result.channel_names),
                                                       list(result.colors))
            self.events.checkpoint_read.emit(result)

        def failed(exc: Exception) -> None:
            if path == self._reading:
                self._reading = None
                self.events.checkpoint_unusable.emit(CheckpointUnusable(
                    path, f"Cannot use this checkpoint: {first_line(exc)}"))

        self._background(info_job(path, tuple(trust)), "Cannot use this checkpoint",
                         on_result=read, on_error=failed)

    def answer_trust(self, request: Untrusted, trusted: bool) -> None:
        """The user's answer to ``trust_asked``: Yes reads the file again with
        ``request.factory`` trusted; No ends the read, ``checkpoint_unusable`` saying
        what was refused (nothing of it was imported or run). An answer for a file no
        longer being read is ignored."""
        if request.path != self._reading:
            return
        if trusted:
            self.read_checkpoint(request.path, (*request.trust, request.factory))
            return
        self._reading = None
        self.events.checkpoint_unusable.emit(CheckpointUnusable(
            request.path, refusal(request.path, request.factory), untrusted=True))

    # -- weights a remote run kept beside the store ----------------------------------------
    def open_store(self, store: str | None) -> None:
        """The image's store is ``store`` now (None: the image has none); look beside it for
        weights a remote run kept when it ended early.

        When ``<store>.remote-last.pt`` exists it is read in the runner's thread (as
        plain data: nothing it names is imported); ``kept_weights`` then brings a
        :class:`~napari_finetune.session.kept.KeptWeights` (also :attr:`kept`): its
        ``line`` says what it is, from when, of how many steps, or why it cannot be
        this store's checkpoint. Answer with :meth:`use_kept_weights` or
        :meth:`discard_kept_weights`. Another store withdraws the offer.
        """
        from napari_finetune.remote.kept import kept_path
        from napari_finetune.session.kept import find_kept_job

        self._looking += 1
        looking = self._looking
        self.store = store
        self._withdraw_kept()
        # A stat here: the file is read in a job only when there is one (most stores).
        if store is None or not kept_path(store).is_file():
            return

        def found(kept: KeptWeights | None) -> None:
            if looking != self._looking or kept is None:
                return  # another store was opened meanwhile, or the file went
            self.kept = kept
            self.events.kept_weights.emit(kept)

        self._background(find_kept_job(store), "Reading the weights kept beside the store "
                                               "failed", on_result=found)

    def _withdraw_kept(self) -> None:
        if self.kept is not None:
            self.kept = None
            self.events.kept_weights.emit(None)

    def _kept_refusal(self, what: str) -> str:
        """Why the offered kept weights cannot be ``what`` ("used", "set aside") now."""
        from napari_finetune.session.kept import changed_since

        if self.kept is None:
            return f"No kept weights to be {what}: none were found beside the store."
        if self._busy is not None:
            return (f"Cannot have the kept weights {what} now: busy with {self._busy.value}; "
                    "wait for it to end.")
        if changed_since(self.kept):
            name = Path(self.kept.path).name
            self.open_store(self.kept.store)  # what is there now is offered instead
            return (f"The kept weights were not {what}: {name} changed since it was "
                    "offered; it is read again.")
        return ""

    def use_kept_weights(self, read: Callable[[str], None] | None = None) -> str | None:
        """Load the kept weights offered (:attr:`kept`) as the checkpoint.

        The file is renamed first (``<store>.remote-last.used-<when>.pt``: the
        offer is not made again, and a later run cut short keeps its weights
        without overwriting the checkpoint in use), then read as any checkpoint
        (its trust asked like any other's). The last run's trainer is dropped.

        Parameters
        ----------
        read : callable, optional
            The front end's own way to load a checkpoint path (e.g. its model field);
            :meth:`read_checkpoint` by default.

        Returns
        -------
        str or None
            The checkpoint's new path; None when refused (``refused`` says why: nothing
            offered, busy, a file that cannot be used, or one that cannot be renamed).
        """
        from napari_finetune.session.kept import move_aside

        if reason := self._kept_refusal("used"):
            return self._refuse_kept(reason)
        kept = self.kept
        assert kept is not None  # _kept_refusal said so
        if not kept.usable:
            return self._refuse_kept(f"Cannot use the kept weights: {kept.problem}; set them "
                                     "aside instead.")
        try:
            path = str(move_aside(kept, "used"))
        except OSError as exc:
            return self._refuse_kept(f"Cannot use the kept weights: {kept.path} cannot be "
                                     f"renamed ({first_line(exc)}).")
        self._withdraw_kept()
        self.release_trainer()  # the run's weights no longer are the model's
        (read or self.read_checkpoint)(path)
        return path

    def discard_kept_weights(self) -> str | None:
        """Set the kept weights offered aside: renamed to
        ``<store>.remote-last.discarded-<when>.pt``, never deleted; the offer ends.

        Returns
        -------
        str or None
            Where the file is now; None when refused (``refused`` says why).
        """
        from napari_finetune.session.kept import move_aside

        if reason := self._kept_refusal("set aside"):
            return self._refuse_kept(reason)
        kept = self.kept
        assert kept is not None  # _kept_refusal said so
        try:
            path = str(move_aside(kept, "discarded"))
        except OSError as exc:
            return self._refuse_kept(f"Cannot set the kept weights aside: {kept.path} cannot "
                                     f"be renamed ({first_line(exc)}).")
        self._withdraw_kept()
        return path

    def _refuse_kept(self, reason: str) -> str | None:
        """Refuse a use or a discard of the kept weights: no path; ``refused`` says why."""
        self._refuse(reason)
        return None

    def save_corrections(
        self, labels: np.ndarray, snapshot: int | None = None, store: str | None = None,
        channel_names: Sequence[str] | None = None, channel_colors: Sequence[str] | None = None,
        on_end: Callable[[bool], None] | None = None,
    ) -> bool:
        """Save a painting through the runner, beside the actions (an autosave: never busy).

        It goes into ``store``'s ``labels/corrections``, or into its sibling
        ``<name>.corrections.ome.zarr`` when the store is read-only
        (:func:`~napari_finetune.session.saving.corrections_target`); the end is
        ``corrections_saved`` or ``corrections_failed`` (with where the next save goes).

        Parameters
        ----------
        labels : numpy.ndarray
            The painting, a copy no one changes any more (the job reads it in another
            thread).
        snapshot : int, optional
            Its number (:func:`~napari_finetune.session.saving.next_snapshot`): a newer
            copy already saved is not overwritten.
        store : str, optional
            The image's store; :attr:`store` by default.
        channel_names, channel_colors : sequence of str, optional
            The classes' names and colours; :attr:`channel_names`, :attr:`channel_colors`
            by default.
        on_end : callable, optional
            ``on_end(saved)`` last, however the save ended.

        Returns
        -------
        bool
            False (``refused`` says why) when there is no store to save beside.
        """
        from napari_finetune.session.work import call_job

        where = store or self.store
        if where is None:
            return self._refuse("Cannot save the corrections: the image has no OME-Zarr "
                                "store; open the image from a .zarr folder.")
        names = list(self.channel_names if channel_names is None else channel_names)
        colors = list(self.channel_colors if channel_colors is None else channel_colors)
        ok: list[bool] = []

        def saved(image: str) -> None:
            ok.append(True)
            self.events.corrections_saved.emit(CorrectionsSaved(where, image))

        def failed(exc: Exception) -> None:
            self.events.corrections_failed.emit(CorrectionsFailed(
                where, f"Autosave of the corrections failed: {first_line(exc)}",
                corrections_target(where)))  # the store may have turned read-only since

        self._background(
            call_job(save_corrections_locked, where, labels, names, snapshot, colors),
            "Autosave of the corrections failed", on_result=saved, on_error=failed,
            on_finished=lambda: on_end(bool(ok)) if on_end is not None else None)
        return True

    def warm_up(self, lora: bool = False) -> None:
        """Import the engine (PEFT too when ``lora``) through the runner, while the user
        looks and paints; ``warming`` counts those under way, ``events.warmed`` says one
        ended. An action is not refused meanwhile: a front end that waits for it (a
        prediction would import torch's modules in a second thread) reads ``warming``."""
        def warmed() -> None:
            self.warming -= 1
            self.events.warmed.emit()

        self.warming += 1
        self._background(jobs.warm_up_job(lora), "Loading the fine-tuning engine failed",
                         on_finished=warmed)

    def release_trainer(self) -> None:
        """Drop the last run's trainer (a new model or run: its weights no longer apply)
        and give its device memory back in the runner's thread: the ``gc.collect()``
        of that release is no click's to pay (0.3 s with the sample open)."""
        if self.trainer is None:
            return
        from napari_finetune.session import heap

        heap.give_back()  # a trainer frozen with the heap would outlive its collection
        self.trainer = None
        self._uncertainty = None
        from napari_finetune.session.work import call_job

        # The job does nothing itself: the runner's guard releases memory as a job ends.
        self._background(call_job(_nothing), "Releasing memory failed")

    # -- the actions ---------------------------------------------------------------------
    def predict(self) -> bool:
        """Predict the whole image: with the last run's weights, else the checkpoint's.

        The region on screen comes first (shown as soon as it is there), then the
        rest of the volume with its progress; :meth:`stop` ends it between blocks,
        keeping what was predicted (the action ends stopped, its prediction kept).
        """
        if reason := self._free(Busy.PREDICT) or self._missing(image=True, checkpoint=True):
            return self._refuse(reason)
        trainer = self.trainer
        model = trainer.model if trainer is not None else None
        normalization = trainer.metadata.get("normalization") if trainer is not None else None
        count = len(self.channel_names) or None
        keep = [i for i, name in enumerate(self.channel_names)
                if name in self.roles and self.roles[name].role is not None]
        self._predict_stop = threading.Event()  # a new one: a late Stop of an old job stays there
        # The slice the user looks at, not the previews' region: the walk's 64 x 256 x 256
        # sample showed the view 20 s after Stop when its 33 slices (four blocks) came first.
        first = self.view if self.view is not None else self._shown_region()
        job = jobs.predict_job(str(self.checkpoint), self.image, count, self.config.device,
                               model=model, normalization=normalization, trust=self.trust,
                               keep=keep, first=first,
                               stop=self._predict_stop.is_set)
        return self._start(Busy.PREDICT, job, self._predicted, on_event=self._region_shown)

    def _region_shown(self, event: Event) -> None:
        # Only the tile: the view comes in up to nine tiles, and re-showing both whole
        # layers for each (as before) put nine whole-volume updates on the main thread.
        if isinstance(event, RegionPredicted) and self.viewer is not None:
            for i, mask in enumerate(event.masks):
                self.viewer.show_region(f"prediction-{self._channel(i)}", mask, event.region,
                                        LayerKind.LABELS)

    def _predicted(self, prediction: jobs.Prediction) -> None:
        self.prediction = prediction
        self.found_objects = {}
        if self.viewer is not None:
            for i, mask in enumerate(prediction.masks):
                self.viewer.show_layer(f"prediction-{self._channel(i)}", mask, LayerKind.LABELS)

    def finetune(self, snapshot: int | None = None) -> bool:
        """Fine-tune the checkpoint on the corrections (saved into the store first).

        Parameters
        ----------
        snapshot : int, optional
            The number of the copy ``corrections`` is, when the caller took it (an
            autosaver's: a later, newer save is then never undone by this one) and no
            longer changes it; None: a copy is taken here, with a new number.
        """
        if reason := self._free(Busy.TRAIN) or self._missing(
                image=True, checkpoint=True, corrections=True):
            return self._refuse(reason)
        corrections = self.corrections
        assert corrections is not None  # _missing(corrections=True) refused None above
        from napari_finetune.arrays import AxesImage

        # Channels and time points come as an AxesImage: paint has its axes without c.
        image_shape = AxesImage.of(self.image).labels_shape
        if tuple(corrections.shape) != image_shape:
            return self._refuse(
                f"Cannot fine-tune: corrections {tuple(corrections.shape)} and image "
                f"{image_shape} differ in shape; paint corrections of the image's shape.")
        if self.scheduler and not self._unencrypted_accepted(self.scheduler):
            return self._refuse(f"Cannot fine-tune: the unencrypted run on {self.scheduler} "
                                "was declined; use its tls:// address with TLS files.")
        from napari_finetune.session.saving import next_snapshot

        if snapshot is None:  # the job reads it in another thread: a copy it alone holds
            corrections, snapshot = np.array(corrections, copy=True), next_snapshot()
        if self.trainer is None:  # nothing old kept: what the run makes is young
            from napari_finetune.session import heap

            # The run's collections (a LoRA run's PEFT imports set off a 437 ms one while
            # training) then walk only the run's own objects, not napari's heap.
            heap.freeze_for_run()
        self.trainer, self.status, self.history = None, None, []
        self.placement = None
        # This run may keep its own weights under the offered file's name: no stale offer.
        self._withdraw_kept()
        self._run_key = (self._where(), self.config.mode)
        self._run_stop = threading.Event()  # a new one: a late Stop of an old run stays there
        job = jobs.train_job(
            str(self.checkpoint), self.image, corrections, self.store,
            self.channel_names, self.config, self.preview_interval_s, self._shown_region,
            trust=self.trust, snapshot=snapshot, channel_colors=self.channel_colors,
            scheduler=self.scheduler, tls_files=self.tls_files, stop=self._run_stop.is_set)
        return self._start(Busy.TRAIN, job, lambda _: None, on_event=self._run_event)

    def _unencrypted_accepted(self, address: str) -> bool:
        """Whether a run may go to ``address``: encrypted, this machine, accepted before in
        this session, or accepted now by :attr:`confirm_unencrypted`."""
        from napari_finetune.remote.preflight import unencrypted_line

        line = unencrypted_line(address)
        if line is None or address in self.unencrypted_ok or self.confirm_unencrypted is None:
            return True
        if not self.confirm_unencrypted(address, line):
            return False
        self.unencrypted_ok.add(address)
        return True

    def _shown_region(self) -> tuple[slice, ...] | None:
        """The region on screen now: the viewer port's, else the one the front end keeps."""
        return self.viewer.shown_region() if self.viewer is not None else self.region

    def _run_event(self, event: Event) -> None:
        if isinstance(event, TrainerReady):
            self.trainer = event.trainer
            self._uncertainty = None  # new weights
            if self._stop_asked:  # Stop came while the checkpoint was loading
                event.trainer.stop()
        elif isinstance(event, RunStatus):
            self.status = event.status
            self.history.append(event.status)
            if event.status.kind in ("step", "finished", "stopped"):
                device = getattr(getattr(self.trainer, "device", None), "type", None)
                self.step_times.record_run(*self._run_key, event.status.step,
                                           event.status.elapsed_s, resolved=device)
            self.events.status.emit(event.status)
        elif isinstance(event, Placement):
            self.placement = event.text
            self.events.placement.emit(event.text)
        elif isinstance(event, Preview) and self.viewer is not None:
            for i, probs in enumerate(event.probs):
                self.viewer.show_layer(f"preview-{self._channel(i)}", probs, LayerKind.IMAGE)

    def export(self, path: str) -> bool:
        """Write the last run's weights (adapters merged, run record, roles) to ``path``."""
        if reason := self._free(Busy.EXPORT):
            return self._refuse(reason)
        if self.trainer is None or self.trainer.steps_done == 0:
            return self._refuse("Cannot export: no fine-tuning step was applied yet; "
                                "fine-tune first.")
        if self.roles_error:  # the file would carry roles nobody chose
            return self._refuse(f"Cannot export: {self.roles_error}")
        roles, sources = self._roles_to_keep()
        job = jobs.export_job(self.trainer, path, roles, sources)
        return self._start(Busy.EXPORT, job, self._exported)

    def _roles_to_keep(self) -> tuple[dict[str, ChannelRole] | None, dict[str, dict[str, str]]]:
        """The roles to record and their values' sources: those the last Objects used
        while the roles it started from are still the user's, else the user's as they are."""
        found = self.roles_found
        mine = {c: r for c, r in self.roles.items() if found is not None and c in found.base}
        if found is not None and mine in (found.base, found.roles):
            return {**self.roles, **found.roles} or None, found.sources
        return dict(self.roles) or None, {}

    def _exported(self, path: str) -> None:
        self.exported = path

    def save_predictions(
        self, masks: Mapping[str, np.ndarray] | None = None,
        objects: Mapping[str, np.ndarray] | None = None,
    ) -> bool:
        """Write masks (and objects) into the store's ``labels/``: ``prediction-<channel>``
        and ``objects-<channel>``.

        Parameters
        ----------
        masks : Mapping[str, numpy.ndarray], optional
            Each channel's mask to write (the widget's: its layers as the user sees
            them, deleted ones left out); by default the last prediction's.
        objects : Mapping[str, numpy.ndarray], optional
            Each channel's object ids; by default those found of the last prediction.
            Objects of another shape than the masks are left out: they belong to an
            earlier prediction and would not match these masks.
        """
        if reason := self._free(Busy.SAVE) or (
                self._missing(prediction=True) if masks is None else ""):
            return self._refuse(reason)
        if self.store is None:
            return self._refuse("Cannot save predictions: the image has no OME-Zarr store; "
                                "open the image from a .zarr folder.")
        if masks is None:
            assert self.prediction is not None  # _missing checked it
            masks = {self._channel(i): m for i, m in enumerate(self.prediction.masks)}
        if not masks:
            return self._refuse("Cannot save predictions: no mask to write; press Predict "
                                "first.")
        if objects is None:
            objects = {channel: found.labels for channel, found in self.found_objects.items()}
        from napari_finetune import palette

        defaults = palette.default_colors(max(len(self.channel_names), len(masks)))
        colors = [*self.channel_colors, *defaults[len(self.channel_colors):]]
        arrays = [(channel, colors[self._index(channel, i)], mask)
                  for i, (channel, mask) in enumerate(masks.items())]
        shape = tuple(arrays[0][2].shape)
        kept = [(channel, ids) for channel, ids in objects.items() if tuple(ids.shape) == shape]
        job = jobs.save_predictions_job(self.store, arrays, kept)
        return self._start(Busy.SAVE, job, self._saved)

    def _saved(self, names: list[str]) -> None:
        self.saved = names

    def objects(self) -> bool:
        """Instance labels of each channel with a role, from the last prediction.

        Refused (one line) while busy, before a prediction, while :attr:`roles_error`
        says the roles cannot be used, when no channel has a role, and when the last
        prediction kept no probability of a channel that has one now (it had none then).
        """
        if reason := self._free(Busy.OBJECTS) or self._missing(prediction=True):
            return self._refuse(reason)
        if self.roles_error:
            return self._refuse(f"Cannot count objects: {self.roles_error}")
        assert self.prediction is not None  # _missing checked it
        probabilities = {self._channel(i): p for i, p in self.prediction.probabilities.items()}
        roles = {c: r for c, r in self.roles.items() if r.role is not None}
        if not roles:
            return self._refuse(no_roles_message(self.info) if self.info is not None else (
                "No objects: no channel has a role; give a channel a role (boundary or "
                "object), then predict."))
        if missing := [c for c in roles if c not in probabilities]:
            # Predict keeps the probability of the channels with a role then only.
            return self._refuse(
                f"No objects: press Predict again: the last Predict kept no probability of "
                f"{', '.join(missing)} (no role then)")
        # The painting (else the prediction) gives each object channel's seed distance and
        # min size where the user set none: a copy of it as it is now (the job reads it in
        # another thread).
        corrections = self.corrections
        shape = np.shape(next(iter(probabilities.values())))
        if corrections is not None and tuple(np.shape(corrections)) != tuple(shape):
            corrections = None  # painted on another image: it says nothing of these objects
        painted = None if corrections is None else np.array(corrections, copy=True)
        names = list(self.channel_names) or list(probabilities)
        user_set = {c: set(v) for c, v in self.roles_set.items()}
        config, store = self.config, self.store
        from napari_finetune.arrays import AxesImage
        from napari_finetune.objects.from_painting import sizing_time_point

        # A time series' probabilities are (T, ...) per channel: sized at one time point
        # (as the command line does), objects found per time point.
        image = AxesImage.of(self.image) if self.image is not None else None
        has_time = image is not None and image.has_time and len(shape) == len(
            image.labels_shape)
        t = sizing_time_point(painted, shape[0]) if has_time else None

        def job() -> Job[tuple[RolesFromPainting, dict[str, derived.ChannelObjects]]]:
            # The voxel size training used: the config's, else the store's scale (read
            # here, in the job's thread; before, the objects were measured in voxels
            # while the run trained on physical patches).
            voxel_size = (jobs.with_store_voxel_size(config, store).voxel_size
                          if config.voxel_size is None and store else config.voxel_size)
            mine = {c: probabilities[c] for c in roles}
            sized = mine if t is None else {c: p[t] for c, p in mine.items()}
            sized_painting = painted if t is None or painted is None else painted[t]
            # Where the painting shows no whole objects (strokes), the predicted ones say
            # how large the channel's objects are.
            found = yield from derived.roles_job(roles, sized_painting, names, user_set,
                                                 voxel_size, sized)
            objects = yield from derived.objects_job(mine, found.roles, voxel_size, has_time)
            return found, objects

        return self._start(Busy.OBJECTS, job(), self._objects_found)

    def _objects_found(
        self, result: tuple[RolesFromPainting, dict[str, derived.ChannelObjects]]
    ) -> None:
        self.roles_found, self.found_objects = result
        if self.viewer is not None:
            for channel, objects in self.found_objects.items():
                self.viewer.show_layer(f"objects-{channel}", objects.labels, LayerKind.LABELS)

    def suggest(self, region_shape: Sequence[int] | None = None) -> bool:
        """The next region to paint: the most uncertain one with nothing painted yet, of
        ``region_shape`` (by default half a training patch of :attr:`config`).

        The uncertainty of the current weights is computed once; asked again,
        the next region is suggested (the earlier ones are skipped). Other weights
        (another checkpoint, a run's new steps) compute it anew, and the suggestions
        start over.
        """
        if reason := self._free(Busy.SUGGEST) or self._missing(image=True, checkpoint=True):
            return self._refuse(reason)
        # The inputs as they are now: the job reads them in the runner's thread, and the
        # caller may change them for its next action meanwhile.
        from napari_finetune.arrays import AxesImage

        image, checkpoint, trainer = self.image, str(self.checkpoint), self.trainer
        trust, count, device = self.trust, len(self.channel_names) or None, self.config.device
        axes_image = AxesImage.of(image)  # channels and time points come as an AxesImage
        shape = axes_image.spatial_shape
        # Half a training patch: a region a few strokes cover, and a patch's context around it.
        region = tuple(region_shape or (max(1, p // 2)
                                        for p in self.config.patch_shape[-len(shape):]))
        if axes_image.has_time and len(region) == len(shape):
            region = (1, *region)  # the uncertainty has the time axis; a stroke paints one
        key = (checkpoint, id(trainer), trainer.steps_done if trainer is not None else -1)
        fresh = self._uncertainty is None or self._uncertainty[0] != key
        cached = None if fresh or self._uncertainty is None else self._uncertainty[1]
        corrections, exclude = self.corrections, [] if fresh else list(self.suggested)

        def job() -> Job[tuple[np.ndarray, Suggestion | None]]:
            unsure = cached
            if unsure is None:
                unsure = yield from derived.uncertainty_job(
                    checkpoint, image, count, device,
                    model=trainer.model if trainer else None,
                    normalization=trainer.metadata.get("normalization") if trainer else None,
                    trust=trust)
            found = yield from derived.suggest_job(unsure, corrections, region, exclude)
            return unsure, found

        def suggested(result: tuple[np.ndarray, Suggestion | None]) -> None:
            unsure, found = result
            self._uncertainty = (key, unsure)
            self.suggestion = found
            if fresh:  # regions suggested for other weights say nothing of these
                self.suggested = []
            if found is not None:
                self.suggested.append(found.box)
            if self.viewer is not None and cached is None:
                self.viewer.show_layer("uncertainty", unsure, LayerKind.IMAGE)

        return self._start(Busy.SUGGEST, job(), suggested)

    @property
    def uncertainty(self) -> np.ndarray | None:
        """The uncertainty map :meth:`suggest` computed last (None before), of the weights
        it had then: a new array each time it is computed anew."""
        return None if self._uncertainty is None else self._uncertainty[1]

    def export_bioimageio(self, path: str) -> bool:
        """Write a bioimage.io package (tested by bioimage.io's own checks) to ``path``.

        Its weights are the last run's (its trainer), else the checkpoint's; its
        instance roles are :attr:`roles` (the source's when empty); its test
        tensors are cut from :attr:`image`. Refused while :attr:`roles_error` says
        the roles cannot be used.
        """
        if reason := self._free(Busy.BIOIMAGEIO) or self._missing(image=True, checkpoint=True):
            return self._refuse(reason)
        if self.roles_error:
            return self._refuse(f"Cannot export: {self.roles_error}")
        source = self.trainer if self.trainer is not None else str(self.checkpoint)
        job = jobs.bioimageio_job(source, path, self.image, trust=self.trust,
                                  roles=dict(self.roles) or None)
        return self._start(Busy.BIOIMAGEIO, job, self._packaged)

    def _packaged(self, path: str) -> None:
        self.package = path

    def add_structure(self, name: str, role: str, out: str | None = None) -> bool:
        """Give the checkpoint one more output channel ``name`` of ``role`` ("object" or
        "boundary"), saved as a new checkpoint (``out``, else beside the old one; one
        shipped with the package goes beside :attr:`store` or into the user's data folder:
        :func:`~napari_finetune.session.structure.structure_path`), which becomes
        :attr:`checkpoint`; :attr:`added` says its path and its painting label.
        The last run's weights are dropped (the new model starts from the checkpoint)."""
        if reason := self._free(Busy.STRUCTURE) or self._missing(checkpoint=True):
            return self._refuse(reason)
        if not name.strip():
            return self._refuse("Cannot add a structure: give it a name.")
        from napari_finetune.session.structure import add_structure_job

        job = add_structure_job(str(self.checkpoint), name.strip(), role, self.trust, out,
                                self.store)
        return self._start(Busy.STRUCTURE, job, self._structure_added)

    def _structure_added(self, added: StructureAdded) -> None:
        self.added, self.checkpoint = added, added.path
        self.channel_names = list(added.channel_names)
        self.channel_colors = []  # the palette's, for the new count
        self.release_trainer()

    # -- how long a run takes ------------------------------------------------------------
    def _where(self) -> str:
        """Where a run of the current settings trains: the device asked, or "scheduler"."""
        return "scheduler" if self.scheduler else self.config.device

    def record_step_time(self, seconds: float, device: str | None = None,
                         mode: str | None = None, resolved: str | None = None) -> None:
        """Keep the seconds one optimizer step took here, timed outside a run (a warm-up),
        for ``device`` as asked and ``mode`` (the current settings' when None)."""
        self.step_times.record(device or self._where(), mode or self.config.mode, seconds,
                               "a timed step", resolved)

    def run_estimate(self, steps: int | None = None, device: str | None = None,
                     mode: str | None = None) -> RunEstimate | None:
        """How long a run takes here, from the last run's or a timed step's seconds; None
        before a step of that device and mode was timed.

        Parameters
        ----------
        steps, device, mode : optional
            The run's (``device`` "scheduler" for a dask worker); by default
            :attr:`config`'s, and "scheduler" when :attr:`scheduler` is set.
        """
        return estimate(self.step_times, self.config.steps if steps is None else steps,
                        device or self._where(), mode or self.config.mode)

    def estimate_line(self, steps: int | None = None, device: str | None = None,
                      mode: str | None = None) -> str:
        """The line a front end shows before the click: how long the run takes here and,
        when long on the CPU, what is faster; before any timing, that the first steps tell."""
        found = self.run_estimate(steps, device, mode)
        if found is not None:
            return found.text
        return unknown_text(self.config.steps if steps is None else steps,
                            device or self._where())

    # -- helpers -------------------------------------------------------------------------
    def _channel(self, index: int) -> str:
        names = self.channel_names
        return names[index] if index < len(names) else f"channel-{index}"

    def _index(self, channel: str, default: int) -> int:
        """``channel``'s place among :attr:`channel_names` (``default`` if not there)."""
        return self.channel_names.index(channel) if channel in self.channel_names else default

    def _missing(self, image: bool = False, checkpoint: bool = False,
                 corrections: bool = False, prediction: bool = False) -> str:
        """The one line naming the first input an action lacks ('' when none)."""
        if image and self.image is None:
            return "Nothing to work on: choose an image first."
        if checkpoint and not self.checkpoint:
            return "No model: choose a checkpoint first."
        if corrections and (self.corrections is None or not np.any(self.corrections)):
            return "Nothing painted: paint a few corrections first."
        if prediction and self.prediction is None:
            return "No prediction yet: press Predict first."
        return ""
