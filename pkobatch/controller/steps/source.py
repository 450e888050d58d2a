"""The source step: the revision to deploy, or why the Stack waits for it.

The revision is ``spec.commit``, the polled head of ``spec.branch`` (``controller.polling``),
a Program's generation (``spec.programRef``) or a Flux source's artifact revision
(``spec.fluxSource``). Waiting for a branch head, a Program or an artifact counts no failure;
a branch that cannot be read stalls the Stack (``SourceUnavailable``, with a Warning Event each
time the error changes: ``Draft.stalled``). When the git server refused the credentials, the
message names the fields and Secrets they come from (``credentials_to_fix``) and the Event has
PKO's reason for it, ``StackGitAuthenticationFailure``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pkobatch.api.constants import (
    CONDITION_READY,
    EVENT_GIT_AUTHENTICATION_FAILURE,
    FLUX_SOURCE_GROUP,
    FLUX_SOURCE_VERSION,
    RECONCILING_PROCESSING_REASON,
    RECONCILING_WAITING_FOR_SOURCE_REASON,
    STALLED_SOURCE_UNAVAILABLE_REASON,
)
from pkobatch.api.program import program_revision
from pkobatch.api.stack.spec import FluxSource, ResourceRef, StackSpec
from pkobatch.api.status import last_update
from pkobatch.controller.steps.draft import DONE, NEXT, Draft, StepResult

# How often to look again while the watch of a Flux kind has not listed (no event comes).
WATCH_RECHECK: Final = 5.0


class _Pending:
    pass


_PENDING: Final = _Pending()


@dataclass(frozen=True)
class _SourceError:
    message: str
    # The Event's reason, when not the Stalled reason.
    event_reason: str | None = None


@dataclass(frozen=True)
class _Waiting:
    """The source object is missing or not ready: wait for its watch event, count nothing."""

    message: str
    # Seconds until the next look, when no watch event is sure to come.
    recheck: float | None = None


def source(draft: Draft) -> StepResult:
    """Resolve the revision to deploy into ``draft.commit`` (NEXT); DONE while waiting for
    it (Reconciling, or the conditions kept while a known Stack waits for a branch head) or
    when the branch cannot be read (Stalled/SourceUnavailable)."""
    spec = draft.valid_spec()
    commit = revision(draft, spec)
    if commit is _PENDING:
        last = last_update(draft.status)
        if (
            not last
            or last.get("generation") != draft.generation
            or (last.get("reconcileRequest") or "") != draft.request
        ):
            draft.reconciling(
                RECONCILING_PROCESSING_REASON,
                f"waiting for the head of branch {spec.branch} of {spec.project_repo}",
            )
        return DONE
    if isinstance(commit, _SourceError):
        draft.stalled(STALLED_SOURCE_UNAVAILABLE_REASON, commit.message, commit.event_reason)
        return DONE
    if isinstance(commit, _Waiting):
        draft.reconciling(RECONCILING_WAITING_FOR_SOURCE_REASON, commit.message)
        if commit.recheck is not None:
            draft.requeue_in(commit.recheck)
        return DONE
    assert commit is None or isinstance(commit, str)
    draft.commit = commit
    return NEXT


def revision(draft: Draft, spec: StackSpec) -> str | _SourceError | _Pending | _Waiting | None:
    """The revision to deploy: spec.commit, the polled branch head, the Program's
    generation, or None (unknown)."""
    if spec.program_ref is not None:
        return _program_revision(draft, spec.program_ref.name)
    if spec.flux_source is not None:
        return _flux_revision(draft, spec.flux_source)
    if not spec.project_repo:
        return None
    if spec.commit:
        return spec.commit
    head = draft.obs.source
    if head is None or (head.commit is None and not head.error):
        return _PENDING
    if head.error:
        message = f"cannot read branch {spec.branch} of {spec.project_repo}: {head.error}"
        if not head.credentials_refused:
            return _SourceError(message)
        return _SourceError(
            f"{message}; the credentials were refused: fix "
            f"{credentials_to_fix(spec, draft.namespace)}. The Stack recovers at the next poll "
            "that succeeds",
            EVENT_GIT_AUTHENTICATION_FAILURE,
        )
    return head.commit


def credentials_to_fix(spec: StackSpec, namespace: str) -> str:
    """The fields (and the Secrets they name) the git credentials of ``spec`` come from."""
    auth = spec.git_auth

    def value(ref: ResourceRef | None) -> str:
        if ref is not None and ref.secret is not None:
            return f"key {ref.secret.key} of Secret {namespace}/{ref.secret.name}"
        return "a literal value"

    if auth is not None and auth.access_token is not None:
        return f"spec.gitAuth.accessToken ({value(auth.access_token)})"
    if auth is not None and auth.basic_auth is not None:
        basic = auth.basic_auth
        return (
            f"spec.gitAuth.basicAuth: userName ({value(basic.user_name)}) and password "
            f"({value(basic.password)})"
        )
    if auth is not None and auth.ssh_auth is not None:
        ssh = auth.ssh_auth
        passphrase = f", password ({value(ssh.password)})" if ssh.password is not None else ""
        return (
            f"spec.gitAuth.sshAuth: sshPrivateKey ({value(ssh.ssh_private_key)}){passphrase}, "
            "and give the key read access to the repository"
        )
    if auth is not None and auth.github_app is not None:
        app = auth.github_app
        return (
            f"spec.gitAuth.githubApp: appID ({value(app.app_id)}), installationID "
            f"({value(app.installation_id)}) and privateKey ({value(app.private_key)}), and "
            "install the app on the repository"
        )
    if spec.git_auth_secret:
        return (
            f"Secret {namespace}/{spec.git_auth_secret} of spec.gitAuthSecret: its accessToken, "
            "its username and password, or its sshPrivateKey"
        )
    return (
        "spec.gitAuth: the repository needs credentials and the Stack gives none; name a "
        f"Secret in namespace {namespace} with accessToken, basicAuth, sshAuth or githubApp"
    )


def _program_revision(draft: Draft, name: str) -> str | _Waiting:
    source = draft.obs.source_object
    program = source.obj if source is not None and source.name == name else None
    if program is None:
        return _Waiting(
            f"Program {name} does not exist in namespace {draft.namespace}; "
            "the Stack runs as soon as it is created"
        )
    return program_revision(program)


def _flux_revision(draft: Draft, flux: FluxSource) -> str | _Waiting:
    """A Flux source's artifact revision; wait (no failure) while it has no artifact."""
    ref = flux.source_ref
    what = f"{ref.kind} {ref.name}"
    source = draft.obs.source_object
    if source is None or not source.watched:
        watch = f"the controller's watch of {ref.kind} ({FLUX_SOURCE_GROUP}/{FLUX_SOURCE_VERSION})"
        if source is not None and source.error:
            message = f"{watch} cannot list them, retrying with backoff: {source.error}"
        else:
            message = (
                f"waiting for {watch} to list them (is Flux's CRD installed, and may the "
                "controller list it?)"
            )
        # The first list sends events only for sources that exist: look again.
        return _Waiting(message, recheck=WATCH_RECHECK)
    if source.obj is None:
        return _Waiting(
            f"{what} does not exist in namespace {draft.namespace}; the Stack runs as soon "
            "as it has an artifact"
        )
    status = source.obj.get("status") or {}
    artifact = status.get("artifact") or {}
    if not artifact.get("revision") or not artifact.get("url"):
        ready = next(
            (
                c
                for c in status.get("conditions") or []
                if isinstance(c, Mapping) and c.get("type") == CONDITION_READY
            ),
            {},
        )
        why = str(ready.get("message") or "no Ready condition yet")
        return _Waiting(f"{what} has no artifact yet ({why}); the Stack runs once it has")
    return str(artifact["revision"])
