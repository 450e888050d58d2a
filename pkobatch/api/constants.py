"""Names shared by every part of pkobatch: API group, labels, annotations, reasons.

PKO's names (group, finalizer, reconcile-request annotation, condition types and reasons)
are kept byte-for-byte so tools written for PKO keep working. pkobatch's own labels and
annotations use the ``pkobatch.io/`` prefix.
"""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal

GROUP: Final = "pulumi.com"
VERSION: Final = "v1"
DEPRECATED_VERSION: Final = "v1alpha1"
KIND: Final = "Stack"
LIST_KIND: Final = "StackList"
PLURAL: Final = "stacks"
SINGULAR: Final = "stack"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
# PKO's Workspace and Update objects (pkobatch.api.workspace, pkobatch.api.update).
AUTO_GROUP: Final = "auto.pulumi.com"
AUTO_VERSION: Final = "v1alpha1"

FINALIZER: Final = "finalizer.stack.pulumi.com"
RECONCILE_REQUEST_ANNOTATION: Final = "pulumi.com/reconciliation-request"
MAX_STACK_NAME_LENGTH: Final = 42

# spec.fluxSource: every Flux object with an artifact is in this group. The controller reads
# each kind it accepts at one version (Flux's stable source API), whatever version a Stack
# names, so a Stack cannot make it start a watch per version.
FLUX_SOURCE_GROUP: Final = "source.toolkit.fluxcd.io"
FLUX_SOURCE_VERSION: Final = "v1"
# The kinds a controller accepts without PKOBATCH_EXTRA_FLUX_SOURCE_KINDS (docs/security.md).
FLUX_SOURCE_KINDS: Final = ("GitRepository", "OCIRepository", "Bucket")

PREFIX: Final = "pkobatch.io"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "pkobatch"
STACK_LABEL: Final = f"{PREFIX}/stack"
OPERATION_LABEL: Final = f"{PREFIX}/operation"
RESULT_LABEL: Final = f"{PREFIX}/result"
# Which controller shard owns a Stack (docs/sharding.md); its Jobs and results carry it too.
SHARD_LABEL: Final = f"{PREFIX}/shard"
# Annotations the CLI writes to request a one-off operation (see docs/operations.md).
OPERATION_REQUEST_ANNOTATION: Final = f"{PREFIX}/operation-request"
ABANDON_ANNOTATION: Final = f"{PREFIX}/abandon"
# Approval of saved plans (spec.approval, docs/api.md): the id of the pending plan to apply,
# or to discard. Written by `pkobatch approve` / `pkobatch reject`.
APPROVE_ANNOTATION: Final = f"{PREFIX}/approve"
REJECT_ANNOTATION: Final = f"{PREFIX}/reject"
JOB_STACK_UID_ANNOTATION: Final = f"{PREFIX}/stack-uid"
# On every Job: the run it was created for (operation, generation, commit, ...), as JSON.
RUN_ANNOTATION: Final = f"{PREFIX}/run"
# The full Stack name on Jobs and result ConfigMaps (the stack label is hashed when > 63 chars).
STACK_NAME_ANNOTATION: Final = f"{PREFIX}/stack-name"

# Field managers: one per writer, as PKO does.
FIELD_MANAGER_CONTROLLER: Final = "pkobatch-controller"
FIELD_MANAGER_CLI: Final = "pkobatch-cli"
FIELD_MANAGER_RUNNER: Final = "pkobatch-runner"

RESULT_KEY: Final = "result.json"
MAX_LABEL_VALUE_LENGTH: Final = 63

Operation = Literal["up", "preview", "refresh", "destroy", "unlock"]
# The operations on a stack's resources (one command each: `pkobatch up`, ...).
OPERATIONS: Final[tuple[Operation, ...]] = ("up", "preview", "refresh", "destroy")
# Every operation a run may have: also `unlock`, which only releases the stack's lock
# (`pulumi cancel`) and is started only by an operation request (`pkobatch unlock`).
RUN_OPERATIONS: Final[tuple[Operation, ...]] = (*OPERATIONS, "unlock")

# Condition types (kstatus "ready protocol").
CONDITION_READY: Final = "Ready"
CONDITION_RECONCILING: Final = "Reconciling"
CONDITION_STALLED: Final = "Stalled"
CONDITION_DRIFTED: Final = "Drifted"
# pkobatch: spec.approval.required and a plan waits for approval (True), or none does.
CONDITION_APPROVAL_PENDING: Final = "ApprovalPending"
# pkobatch: an annotation's value breaks its syntax or size bound and is ignored (True);
# absent when every annotation the controller reads is accepted (api/annotations.py).
CONDITION_ANNOTATIONS_REFUSED: Final = "AnnotationsRefused"
ANNOTATION_INVALID_REASON: Final = "InvalidAnnotation"
# pkobatch: the spec sets PKO fields that cannot apply to a Job (api/ignored_fields.py) and
# are ignored (True, naming each); absent when it sets none.
CONDITION_FIELDS_IGNORED: Final = "FieldsIgnored"
FIELDS_IGNORED_REASON: Final = "NotApplicableToJobs"

# Ready reasons.
READY_COMPLETED_REASON: Final = "ProcessingCompleted"
NOT_READY_IN_PROGRESS_REASON: Final = "NotReadyInProgress"
NOT_READY_STALLED_REASON: Final = "NotReadyStalled"
SUSPENDED_REASON: Final = "Suspended"
# Reconciling reasons.
RECONCILING_PROCESSING_REASON: Final = "StackProcessing"
RECONCILING_RETRY_REASON: Final = "RetryingAfterFailure"
RECONCILING_PREVIEW_FAILED_REASON: Final = "PreviewFailed"
RECONCILING_PREREQUISITE_REASON: Final = "PrerequisiteNotSatisfied"
# pkobatch: the Program or Flux source the Stack names is missing or not ready yet; the
# Stack runs as soon as it is (no failure is counted while waiting).
RECONCILING_WAITING_FOR_SOURCE_REASON: Final = "WaitingForSource"
# pkobatch: a saved plan waits for approval (spec.approval); nothing changes until then.
RECONCILING_APPROVAL_PENDING_REASON: Final = "ApprovalPending"
# Stalled reasons.
STALLED_SPEC_INVALID_REASON: Final = "SpecInvalid"
STALLED_SOURCE_UNAVAILABLE_REASON: Final = "SourceUnavailable"
STALLED_PULUMI_VERSION_TOO_LOW_REASON: Final = "PulumiVersionTooLow"
STALLED_WORKSPACE_FAILED_REASON: Final = "WorkspaceFailed"
STALLED_UPDATE_FAILED_REASON: Final = "UpdateFailed"
STALLED_NAMESPACE_TERMINATING_REASON: Final = "NamespaceTerminating"
STALLED_DESTROY_HELD_REASON: Final = "DestroyedOnRequest"
# pkobatch: planning the Stack failed (a bug); the message has the error.
STALLED_RECONCILE_ERROR_REASON: Final = "ReconcileError"
# pkobatch: spec.prerequisites lead back to a Stack on the way (the message names the cycle).
STALLED_PREREQUISITE_CYCLE_REASON: Final = "PrerequisiteCycle"
# pkobatch: the run's ServiceAccount lacks a right a feature of the spec needs (the message
# names verb, resource and namespace); found before any operation ran.
STALLED_MISSING_PERMISSION_REASON: Final = "MissingPermission"

# Result reasons written by the runner (closed set, docs/runner.md).
ResultReason = Literal[
    "Succeeded",
    "UpdateConflict",
    "InvalidAccessToken",
    "SourceUnavailable",
    "StackNotFound",
    "ProgramError",
    "Cancelled",
    "DeadlineExceeded",
    "Interrupted",
    "InvalidSpec",
    "JobFailed",
    # An approved up whose stack or program no longer matches the saved plan it was given.
    "PlanMismatch",
    # The run's ServiceAccount lacks a right a feature of the spec needs (pkobatch.runner.rights).
    "MissingPermission",
    # Structured config and a Pulumi CLI too old to set it (PKO's Stalled reason).
    "PulumiVersionTooLow",
    # The kernel killed a process of the run's container for lack of memory (runner.memory).
    "OOMKilled",
]
RESULT_REASONS: Final[tuple[str, ...]] = ResultReason.__args__  # type: ignore[attr-defined]
# Failures a retry cannot fix (the spec, or the image, lacks something), with the Stalled
# reason each shows: the Stack stalls at once and runs again only when its spec, source or
# reconcile request changes.
PERMANENT_RESULT_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "InvalidSpec": STALLED_SPEC_INVALID_REASON,
        "MissingPermission": STALLED_MISSING_PERMISSION_REASON,
        "PulumiVersionTooLow": STALLED_PULUMI_VERSION_TOO_LOW_REASON,
    }
)

# Event reasons (PKO's).
EVENT_UPDATE_DETECTED: Final = "StackUpdateDetected"
EVENT_CREATED: Final = "StackCreated"
EVENT_CONFIG_INVALID: Final = "StackConfigInvalid"
EVENT_UPDATE_FAILURE: Final = "StackUpdateFailure"
EVENT_GIT_AUTHENTICATION_FAILURE: Final = "StackGitAuthenticationFailure"
EVENT_UPDATE_CONFLICT_DETECTED: Final = "StackUpdateConflictDetected"
EVENT_OUTPUT_RETRIEVAL_FAILURE: Final = "StackOutputRetrievalFailure"
EVENT_INITIALIZATION_FAILURE: Final = "StackInitializationFailure"

# The step at which a failed run stopped, written by the runner when that step has a PKO
# Event reason of its own: the git server refused the credentials, creating or selecting the
# stack (backend login, stack init, its config) failed, reading the outputs after a
# successful update failed.
FailedStep = Literal["gitAuthentication", "stackInitialization", "outputRetrieval"]

PKO_MAX_UPDATE_FAILURES: Final = 3
PKO_MIN_RESYNC_SECONDS: Final = 60
PKO_DEFAULT_MAX_BACKOFF_SECONDS: Final = 86400

# The run container's name: Job and workspace templates name it to change it (as PKO's "pulumi").
RUN_CONTAINER_NAME: Final = "pulumi"
