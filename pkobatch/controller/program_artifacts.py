"""Every Program's ``status.artifact``, and the artifacts served over HTTP (PKO's
program-controller and file server; the artifact's form is ``pkobatch.api.program``'s).

- **Status.** A Program's event queues its ``ProgramKey`` (``stores.program_and_stacks_
  naming_it``), whether or not a Stack uses it; ``reconcile`` writes ``status.artifact`` and
  ``status.observedGeneration`` only when they differ from what the cached Program shows
  (``program_status``), so a resync or the echo of the write itself writes nothing. Only
  the main controller keeps them (not a shard: every controller watches every Program, and
  two writers with different Services would overwrite each other's URL).
- **Serving.** ``GET /programs/<namespace>/<name>/<generation>`` answers the tarball of the
  cached Program when it is in a reconciled namespace and at that generation (else 404, as
  PKO's server answers an old generation). Nothing is kept between requests: the tarball is
  rebuilt from the cached object, so memory does not grow with the number of Programs.
  Read-only and unauthenticated, like PKO's file server (docs/security.md); it listens only
  while this replica leads, after the caches synced (``start``/``stop``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pkobatch.api.objects import JSON
from pkobatch.api.program import (
    PROGRAMS_PATH,
    program_artifact,
    program_revision,
    program_tarball,
)
from pkobatch.config import ProgramServerSettings
from pkobatch.controller.act import Actor
from pkobatch.runtime.health import PLAIN_TEXT, HttpEndpoints, Response
from pkobatch.runtime.interfaces import ObjectKey, ReconcileResult
from pkobatch.runtime.store import Store

log = logging.getLogger(__name__)


def artifact_base_url(settings: ProgramServerSettings, controller_namespace: str) -> str:
    """The URL of the artifact server as the cluster sees it: its Service's DNS name."""
    namespace = settings.service_namespace or controller_namespace
    return f"http://{settings.service}.{namespace}.svc:{settings.service_port}"


def program_status(program: Mapping[str, Any], base_url: str, now: datetime) -> JSON | None:
    """The ``status`` to write on ``program``; None when its status is current (every
    field but ``lastUpdateTime``, which changes only with the rest) or the body is not a
    valid program (the Stacks using it report why)."""
    try:
        artifact = program_artifact(program, base_url, now).to_manifest()
    except ValueError:
        return None
    generation = (program.get("metadata") or {}).get("generation")
    status = program.get("status") or {}
    if status.get("observedGeneration") == generation and _timeless(
        status.get("artifact") or {}
    ) == _timeless(artifact):
        return None
    return {"artifact": artifact, "observedGeneration": generation}


def _timeless(artifact: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in artifact.items() if key != "lastUpdateTime"}


class ProgramArtifacts:
    """Keeps Programs' status (``reconcile``) and serves their artifacts (``start``)."""

    def __init__(
        self,
        actor: Actor,
        programs: Store,
        settings: ProgramServerSettings,
        controller_namespace: str,
        clock: Callable[[], datetime],
    ) -> None:
        self._actor = actor
        self._programs = programs
        self._settings = settings
        self._clock = clock
        self.base_url = artifact_base_url(settings, controller_namespace)
        self._in_scope: Callable[[str], bool] = lambda namespace: True
        self._server: HttpEndpoints | None = None

    def serve_only(self, in_scope: Callable[[str], bool]) -> None:
        """Serve only the Programs of namespaces ``in_scope`` accepts (the manager's
        namespace selector)."""
        self._in_scope = in_scope

    def reconcile(self, key: ObjectKey) -> ReconcileResult:
        program = self._programs.get(key.namespace, key.name)
        if program is None:
            return ReconcileResult()
        status = program_status(program, self.base_url, self._clock())
        if status is not None:
            self._actor.record_program_status(key.namespace, key.name, status)
        return ReconcileResult()

    def artifact(self, rest: str, headers: Mapping[str, str]) -> Response:
        """``rest``: ``<namespace>/<name>/<generation>`` of a request below ``/programs/``."""
        parts = rest.split("/")
        if len(parts) != 3 or not all(parts):
            return 404, PLAIN_TEXT, b"not found: use /programs/<namespace>/<name>/<generation>\n"
        namespace, name, generation = parts
        program = self._programs.get(namespace, name) if self._in_scope(namespace) else None
        if program is None:
            return 404, PLAIN_TEXT, f"Program {namespace}/{name} not found\n".encode()
        current = program_revision(program)
        if current != generation:
            message = f"Program {namespace}/{name} is at generation {current}, not {generation}"
            return 404, PLAIN_TEXT, f"{message}: fetch status.artifact.url again\n".encode()
        try:
            tarball = program_tarball(program)
        except ValueError as error:
            return 404, PLAIN_TEXT, f"Program {namespace}/{name} is not valid: {error}\n".encode()
        return 200, {"Content-Type": "application/gzip"}, tarball

    def start(self) -> None:
        if not self._settings.enabled:
            return
        self._server = HttpEndpoints(
            self._settings.addr, {}, prefix_routes={f"/{PROGRAMS_PATH}/": self.artifact}
        )
        self._server.start()
        log.info("serving Program artifacts on %s", self._settings.addr)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
