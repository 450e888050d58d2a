"""The one place pkobatch talks to the Kubernetes API.

Everything above this module works with plain dicts (the JSON the API server sends), never
with the client library's generated models: the models of ``kubernetes`` 37.x validate with
pydantic and reject fields they do not know (a pod-spec field newer than the client, any
custom resource), and deserialising them is slow on hot paths. So this module uses the
library only for what it is good at — kubeconfig / in-cluster credentials, TLS, the
connection pool — and sends raw requests through ``ApiClient.call_api``.

Errors are mapped to a small exception hierarchy (``NotFound``, ``Conflict``,
``AlreadyExists``, ``Gone``, ``Forbidden``, ``Unauthorized``, ``Invalid``,
``Unreachable``) so callers can decide without parsing status codes.

Watches ask for bookmarks and use a *read* timeout (not a total one), so a silently dropped
connection ends the stream instead of hanging forever.

``ClientOverrides`` change the loaded configuration as kubectl's ``--server``, ``--token``,
``--as`` and ``--as-group`` do: another server URL, a bearer token, and impersonation
headers (``Impersonate-User``, one ``Impersonate-Group`` header per group) on every request.

A ``TokenBucket`` given to the client (the controller's ``PKOBATCH_KUBE_QPS`` /
``PKOBATCH_KUBE_BURST``) is shared by every request it sends, watches included; the time
each request waited for its token goes to the ``on_wait`` hook (metrics). The controller's
Events go through ``with_own_rate_limit()``: another bucket of the same size.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar, overload
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from pkobatch.api.objects import JSON
from pkobatch.kube.ratelimit import TokenBucket

IMPERSONATE_USER_HEADER: Final = "Impersonate-User"
IMPERSONATE_GROUP_HEADER: Final = "Impersonate-Group"
MERGE_PATCH: Final = "application/merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
DEFAULT_TIMEOUT: Final = (10.0, 60.0)
Item = TypeVar("Item")
"""What a list's ``transform`` makes of each object."""


@dataclass(frozen=True)
class Resource:
    """An API resource: enough to build its URL paths."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if subresource:
            base += f"/{subresource}"
        return base


STACKS: Final = Resource("pulumi.com", "v1", "stacks", "Stack")
PROGRAMS: Final = Resource("pulumi.com", "v1", "programs", "Program")
# PKO's auto.pulumi.com kinds (pkobatch.controller.auto_runs runs them as Jobs).
WORKSPACES: Final = Resource("auto.pulumi.com", "v1alpha1", "workspaces", "Workspace")
UPDATES: Final = Resource("auto.pulumi.com", "v1alpha1", "updates", "Update")
JOBS: Final = Resource("batch", "v1", "jobs", "Job")
PODS: Final = Resource("", "v1", "pods", "Pod")
CONFIGMAPS: Final = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS: Final = Resource("", "v1", "secrets", "Secret")
EVENTS: Final = Resource("events.k8s.io", "v1", "events", "Event")
CORE_EVENTS: Final = Resource("", "v1", "events", "Event")
SERVICEACCOUNTS: Final = Resource("", "v1", "serviceaccounts", "ServiceAccount")
NAMESPACES: Final = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES: Final = Resource("", "v1", "nodes", "Node", namespaced=False)
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease")
CRDS: Final = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
ROLES: Final = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLEBINDINGS: Final = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTERROLES: Final = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
)
CLUSTERROLEBINDINGS: Final = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
)
SELF_SUBJECT_ACCESS_REVIEWS: Final = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False
)
# Who the API server takes the caller for (the approver's name of `pkobatch approve`).
SELF_SUBJECT_REVIEWS: Final = Resource(
    "authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False
)
DEPLOYMENTS: Final = Resource("apps", "v1", "deployments", "Deployment")
# Who a bearer token belongs to, and what that user may do (secure metrics).
TOKEN_REVIEWS: Final = Resource(
    "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False
)
SUBJECT_ACCESS_REVIEWS: Final = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False
)
PERSISTENTVOLUMES: Final = Resource(
    "", "v1", "persistentvolumes", "PersistentVolume", namespaced=False
)
PERSISTENTVOLUMECLAIMS: Final = Resource(
    "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"
)


_BY_KIND: Final = {
    (r.api_version, r.kind): r
    for r in (
        STACKS,
        PROGRAMS,
        WORKSPACES,
        UPDATES,
        JOBS,
        PODS,
        CONFIGMAPS,
        SECRETS,
        EVENTS,
        CORE_EVENTS,
        SERVICEACCOUNTS,
        NAMESPACES,
        LEASES,
        CRDS,
        ROLES,
        ROLEBINDINGS,
        CLUSTERROLES,
        CLUSTERROLEBINDINGS,
        DEPLOYMENTS,
        PERSISTENTVOLUMES,
        PERSISTENTVOLUMECLAIMS,
    )
}


def resource_for(api_version: str, kind: str) -> Resource:
    """The resource for a manifest's apiVersion and kind (only kinds pkobatch handles)."""
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise ValueError(f"pkobatch does not handle {kind} in {api_version}") from None


@dataclass(frozen=True)
class StatusCause:
    """One entry of a Status's ``details.causes``: what the API server objected to
    (``reason``, e.g. ``FieldValueInvalid`` or ``NamespaceTerminating``) and where
    (``field``, e.g. ``spec.template.spec.containers[0].name``)."""

    reason: str
    field: str
    message: str


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached),
    ``causes`` the Status's ``details.causes``."""

    def __init__(
        self, status: int, reason: str, message: str, causes: tuple[StatusCause, ...] = ()
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes

    def has_cause(self, reason: str, field: str | None = None) -> bool:
        """Whether the API server named ``reason`` (at ``field``, when given) as a cause."""
        return any(
            cause.reason == reason and (field is None or cause.field == field)
            for cause in self.causes
        )


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class AlreadyExists(Conflict):
    pass


class Gone(KubeError):
    pass


class Forbidden(KubeError):
    pass


class Unauthorized(KubeError):
    pass


class Invalid(KubeError):
    pass


class Unreachable(KubeError):
    pass


def _causes(status_obj: Any) -> tuple[StatusCause, ...]:
    details = status_obj.get("details") if isinstance(status_obj, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return tuple(
        StatusCause(
            str(cause.get("reason") or ""),
            str(cause.get("field") or ""),
            str(cause.get("message") or ""),
        )
        for cause in causes or ()
        if isinstance(cause, dict)
    )


def _error_from(status: int, body: bytes | str | None) -> KubeError:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    reason, message = "", text.strip()
    causes: tuple[StatusCause, ...] = ()
    try:
        status_obj = json.loads(text)
        reason = str(status_obj.get("reason", ""))
        message = str(status_obj.get("message", message))
        causes = _causes(status_obj)
    except (ValueError, AttributeError):
        pass
    if status == 404:
        return NotFound(status, reason or "NotFound", message, causes)
    if status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(status, reason or "Conflict", message, causes)
    if status == 410:
        return Gone(status, reason or "Expired", message, causes)
    if status == 403:
        return Forbidden(status, reason or "Forbidden", message, causes)
    if status == 401:
        return Unauthorized(status, reason or "Unauthorized", message, causes)
    if status == 422:
        return Invalid(status, reason or "Invalid", message, causes)
    return KubeError(status, reason or "Error", message, causes)


@dataclass(frozen=True)
class ClientOverrides:
    """What kubectl's ``--server``, ``--token``, ``--as`` and ``--as-group`` change of the
    client configuration a kubeconfig (or the pod) gives."""

    server: str | None = None
    token: str | None = None
    impersonate: str | None = None
    impersonate_groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.impersonate_groups and not self.impersonate:
            # client-go refuses the same: the API server impersonates users, not groups.
            raise ValueError("impersonating groups needs a user to impersonate (--as)")

    def server_url(self) -> str | None:
        """``--server`` as a URL: as kubectl, a host[:port] without a scheme is https."""
        if not self.server:
            return None
        return self.server if "://" in self.server else f"https://{self.server}"

    def headers(self) -> tuple[tuple[str, str], ...]:
        if not self.impersonate:
            return ()
        groups = tuple((IMPERSONATE_GROUP_HEADER, group) for group in self.impersonate_groups)
        return ((IMPERSONATE_USER_HEADER, self.impersonate), *groups)


RequestHook = Callable[[str, str, int], None]
"""Called after every request with (method, path, status) — used for metrics."""
WaitHook = Callable[[str, float], None]
"""Called before every rate-limited request with (method, seconds waited for its token)."""


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: JSON


def _response_lines(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """The lines of a streamed response as they arrive (the last may lack a newline)."""
    buffer = b""
    for chunk in response.stream(64 * 1024, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line + b"\n"
    if buffer:
        yield buffer


class WatchStream:
    """One watch request. Iterate for events; ``stop()`` from another thread ends it."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError, AttributeError):
            self._response.shutdown()

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for line in _response_lines(self._response):
                if line.strip() and not self._stopped.is_set():
                    yield self._event(line)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if not self._stopped.is_set():
                raise Unreachable(0, "WatchInterrupted", f"watch stream broke: {exc}") from exc
        finally:
            self._response.release_conn()

    @staticmethod
    def _event(line: bytes) -> WatchEvent:
        event = json.loads(line)
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            raise _error_from(int(obj.get("code", 500)), json.dumps(obj))
        return WatchEvent(type=str(event["type"]), object=obj)


class Kube:
    """A thin, thread-safe client for raw JSON requests against one cluster."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        on_request: RequestHook | None = None,
        *,
        rate_limiter: TokenBucket | None = None,
        on_wait: WaitHook | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ):
        self._api = api_client
        self._on_request = on_request
        self._rate_limiter = rate_limiter
        self._on_wait = on_wait
        # Sent with every request besides what the configuration adds (impersonation).
        self._headers = headers

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        on_request: RequestHook | None = None,
        qps_pool: int = 16,
        *,
        rate_limiter: TokenBucket | None = None,
        on_wait: WaitHook | None = None,
        overrides: ClientOverrides | None = None,
    ) -> Kube:
        """In-cluster credentials when running in a pod (and no kubeconfig was named), else the
        kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``), changed by ``overrides``. Without
        ``rate_limiter`` requests are not limited (the CLI, tests)."""
        configuration = k8s_client.Configuration()
        try:
            if kubeconfig is None and context is None:
                try:
                    k8s_config.load_incluster_config(client_configuration=configuration)
                except ConfigException:
                    k8s_config.load_kube_config(client_configuration=configuration)
            else:
                k8s_config.load_kube_config(
                    config_file=kubeconfig, context=context, client_configuration=configuration
                )
        except (ConfigException, OSError) as exc:
            raise Unreachable(
                0,
                "NoConfiguration",
                f"cannot load Kubernetes credentials ({exc}); pass --kubeconfig or set KUBECONFIG",
            ) from exc
        configuration.connection_pool_maxsize = qps_pool
        overrides = overrides or ClientOverrides()
        server = overrides.server_url()
        if server:
            configuration.host = server
        if overrides.token:
            # As kubectl: the token replaces the kubeconfig's token or token source; a client
            # certificate of the kubeconfig is still presented.
            configuration.api_key = {"authorization": f"Bearer {overrides.token}"}
            configuration.api_key_prefix = {}
            configuration.refresh_api_key_hook = None
        return cls(
            k8s_client.ApiClient(configuration),
            on_request,
            rate_limiter=rate_limiter,
            on_wait=on_wait,
            headers=overrides.headers(),
        )

    def with_own_rate_limit(self) -> Kube:
        """A client on the same connections and hooks whose requests take tokens from a
        bucket of their own, as large and as fast as this one's (none if this one has none):
        client-go's second clientset from the same config. For requests that must neither
        wait behind this client's nor make them wait (the controller's Events)."""
        limiter = self._rate_limiter
        return Kube(
            self._api,
            self._on_request,
            rate_limiter=limiter.another() if limiter else None,
            on_wait=self._on_wait,
            headers=self._headers,
        )

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._api.close()

    # -- raw requests -------------------------------------------------------------------

    def _throttle(self, method: str) -> None:
        if self._rate_limiter is None:
            return
        waited = self._rate_limiter.wait()
        if self._on_wait:
            self._on_wait(method, waited)

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
    ) -> Any:
        params = {k: v for k, v in (query or {}).items() if v is not None}
        for key, value in params.items():
            if isinstance(value, bool):
                params[key] = "true" if value else "false"
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        _, url, header_params, serialized, _ = self._api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        if params:
            url += "?" + urlencode(params)
        self._throttle(method)
        try:
            response = self._api.call_api(
                method,
                url,
                header_params=self._with_own_headers(header_params),
                body=serialized,
                _request_timeout=timeout,
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            if self._on_request:
                self._on_request(method, path, 0)
            status = getattr(exc, "status", 0) or 0
            if status:
                raise _error_from(status, getattr(exc, "body", "")) from exc
            raise Unreachable(0, "Unreachable", f"cannot reach {self.host}: {exc}") from exc
        if self._on_request:
            self._on_request(method, path, response.status)
        return response

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
    ) -> JSON:
        response = self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        data = response.read()
        if response.status >= 400:
            raise _error_from(response.status, data)
        if not data:
            return {}
        decoded = json.loads(data)
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    def request_text(self, path: str, *, query: Mapping[str, Any] | None = None) -> str:
        """GET a non-JSON endpoint (e.g. /metrics, /version text)."""
        response = self._send("GET", path, query=query)
        data = response.read()
        if response.status >= 400:
            raise _error_from(response.status, data)
        return str(data.decode("utf-8", "replace"))

    # -- typed helpers over resources ---------------------------------------------------

    def serves(self, res: Resource) -> bool:
        """Does the API server serve ``res`` (for a custom kind: is its CRD installed)?"""
        base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        try:
            listing = self.request("GET", base)
        except NotFound:
            return False
        return any(entry.get("name") == res.plural for entry in listing.get("resources") or ())

    def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        return self.request("GET", res.path(namespace, name))

    def get_or_none(self, res: Resource, name: str, namespace: str | None = None) -> JSON | None:
        try:
            return self.get(res, name, namespace)
        except NotFound:
            return None

    @overload
    def list_objects(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[JSON], str]: ...

    @overload
    def list_objects(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        transform: Callable[[JSON], Item],
    ) -> tuple[list[Item], str]: ...

    def list_objects(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        transform: Callable[[JSON], Any] | None = None,
    ) -> tuple[list[Any], str]:
        """All items (following ``continue`` tokens) and the list's resourceVersion.

        ``transform`` is applied to each item as its page arrives, so a cache that keeps
        part of each object (or keeps it packed) never holds every whole object at once."""
        items: list[Any] = []
        token: str | None = None
        while True:
            page = self.request(
                "GET",
                res.path(namespace),
                query={
                    "labelSelector": label_selector,
                    "fieldSelector": field_selector,
                    "limit": page_size,
                    "continue": token,
                },
            )
            # Taken off the page one at a time: a whole object goes as soon as ``transform``
            # has taken what it keeps, not when the page ends.
            page_items = list(reversed(page.pop("items", None) or []))
            while page_items:
                item = page_items.pop()
                item.setdefault("apiVersion", res.api_version)
                item.setdefault("kind", res.kind)
                items.append(transform(item) if transform else item)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def create(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON:
        return self.request("POST", res.path(namespace), body=body)

    def replace(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON:
        name = body["metadata"]["name"]
        return self.request("PUT", res.path(namespace, name), body=body)

    def merge_patch(
        self,
        res: Resource,
        name: str,
        patch: JSON,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        return self.request(
            "PATCH",
            res.path(namespace, name, subresource),
            query={"fieldManager": field_manager},
            body=patch,
            content_type=MERGE_PATCH,
        )

    def apply(
        self,
        res: Resource,
        body: JSON,
        *,
        field_manager: str,
        namespace: str | None = None,
        subresource: str | None = None,
        force: bool = True,
        dry_run: bool = False,
    ) -> JSON:
        """Server-side apply (the body is full intent for the fields this manager owns)."""
        name = body["metadata"]["name"]
        return self.request(
            "PATCH",
            res.path(namespace or body["metadata"].get("namespace"), name, subresource),
            query={
                "fieldManager": field_manager,
                "force": force,
                "dryRun": "All" if dry_run else None,
            },
            body=body,
            content_type=APPLY_PATCH,
        )

    def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
        uid: str | None = None,
        grace_period_seconds: int | None = None,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
    ) -> JSON:
        body: JSON = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        return self.request("DELETE", res.path(namespace, name), body=body, timeout=timeout)

    def _with_own_headers(self, headers: Mapping[str, str]) -> urllib3.HTTPHeaderDict:
        """``headers`` and this client's own (a header name may repeat: one
        ``Impersonate-Group`` per group, as the API server reads them)."""
        combined = urllib3.HTTPHeaderDict(headers)
        for name, value in self._headers:
            combined.add(name, value)
        return combined

    def _open_stream(
        self,
        path: str,
        query: Mapping[str, Any],
        read_timeout: float,
        method_label: str,
        accept: str = "application/json",
    ) -> urllib3.BaseHTTPResponse:
        """Start a long GET whose body is read as it arrives; raises on an error status."""
        _, url, header_params, _, _ = self._api.param_serialize(
            method="GET",
            resource_path=path,
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )
        params = {k: v for k, v in query.items() if v is not None}
        if params:
            url += "?" + urlencode(params)
        self._throttle(method_label)
        try:
            response = self._api.rest_client.pool_manager.request(
                "GET",
                url,
                headers=self._with_own_headers(header_params),
                preload_content=False,
                timeout=urllib3.Timeout(connect=10.0, read=read_timeout),
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self._on_request:
                self._on_request(method_label, path, 0)
            raise Unreachable(0, "Unreachable", f"cannot reach {self.host}: {exc}") from exc
        if self._on_request:
            self._on_request(method_label, path, response.status)
        if response.status >= 400:
            data = response.read()
            response.release_conn()
            raise _error_from(response.status, data)
        return response

    def stream_lines(
        self, path: str, *, query: Mapping[str, Any] | None = None, read_timeout: float = 300.0
    ) -> Iterator[str]:
        """GET a streaming text endpoint (``pods/log?follow=true``) line by line until the
        server ends it; no bytes for ``read_timeout`` seconds ends it with ``Unreachable``."""
        response = self._open_stream(path, query or {}, read_timeout, "GET", accept="*/*")
        try:
            for line in _response_lines(response):
                yield line.decode("utf-8", "replace")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unreachable(0, "StreamInterrupted", f"stream broke: {exc}") from exc
        finally:
            response.release_conn()

    def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str = "",
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        read_timeout: float = 90.0,
    ) -> WatchStream:
        """Start a watch; the server ends it after ``timeout_seconds``; no bytes for
        ``read_timeout`` seconds (bookmarks come about once a minute) ends it with
        ``Unreachable``."""
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version or None,
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "timeoutSeconds": timeout_seconds,
        }
        response = self._open_stream(res.path(namespace), query, read_timeout, "WATCH")
        return WatchStream(response)
