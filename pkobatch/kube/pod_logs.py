"""Reading the output of a run's pod: ``pods/log``, which the API server proxies to the
kubelet of the pod's node (on the local control plane, the node agent serves it as a kubelet
does), so the CLI reads logs the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator

from pkobatch.kube.client import PODS, Kube, KubeError


class LogsUnavailable(Exception):
    """The pod's output cannot be read (no such pod or log, or the node does not serve it)."""


class ApiPodLogs:
    """``pods/log`` through the API server (needs a kubelet behind it). ``read`` gives the
    output so far, ``follow`` yields lines (with their newline) as they are written, until
    the container ends; both from the last ``tail_lines`` lines when given."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    def read(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        try:
            return self._kube.request_text(
                PODS.path(namespace, pod, "log"),
                query={"container": container, "tailLines": tail_lines},
            )
        except KubeError as exc:
            raise LogsUnavailable(f"logs of pod {namespace}/{pod}: {exc.message}") from exc

    def follow(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> Iterator[str]:
        try:
            yield from self._kube.stream_lines(
                PODS.path(namespace, pod, "log"),
                query={"container": container, "follow": "true", "tailLines": tail_lines},
            )
        except KubeError as exc:
            raise LogsUnavailable(f"logs of pod {namespace}/{pod}: {exc.message}") from exc
