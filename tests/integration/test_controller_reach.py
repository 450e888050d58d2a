"""What a Stack's author can make the controller reach, on the real control plane and the
real controller process (docs/security.md): Flux source watches stay bounded by the kinds
the operator allows."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    CONTROLLER_NAMESPACE,
    CONTROLLER_SA,
    ControllerProcess,
    apply_stack,
    condition,
    wait_stack,
)

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    STACKS,
    Invalid,
    Kube,
    NotFound,
)

JSON = dict[str, Any]
# The controller may read kind Gadget, whose CRD no one installs: the API server answers 404.
GADGET_RBAC = "pkobatch-tests-gadgets"


def flux_spec(kind: str, api_version: str = "source.toolkit.fluxcd.io/v1") -> JSON:
    return {
        "stack": "dev",
        "fluxSource": {"sourceRef": {"apiVersion": api_version, "kind": kind, "name": "src"}},
    }


def spec_invalid(stack: JSON) -> bool:
    return condition(stack, "Stalled").get("reason") == "SpecInvalid"


@pytest.fixture
def gadget_rbac(kube: Kube, controller_rbac: None) -> Iterator[None]:
    """What an operator adding a kind grants: get, list and watch on its resource."""
    kube.create(
        CLUSTERROLES,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": GADGET_RBAC},
            "rules": [
                {
                    "apiGroups": ["source.toolkit.fluxcd.io"],
                    "resources": ["gadgets"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
    )
    kube.create(
        CLUSTERROLEBINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": GADGET_RBAC},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": GADGET_RBAC,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": CONTROLLER_SA,
                    "namespace": CONTROLLER_NAMESPACE,
                }
            ],
        },
    )
    yield
    for resource in (CLUSTERROLEBINDINGS, CLUSTERROLES):
        with contextlib.suppress(NotFound):
            kube.delete(resource, GADGET_RBAC)


@pytest.fixture
def start_controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None
) -> Iterator[Callable[..., ControllerProcess]]:
    """``start(**env)``: the real controller for the test's namespace, stopped after it."""
    started: list[ControllerProcess] = []

    def start(**env: str) -> ControllerProcess:
        process = ControllerProcess(
            cluster, namespace, tmp_path / f"controller-{len(started)}", env=env
        )
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


def idle_threads(controller: ControllerProcess) -> int:
    """The controller's threads with nothing to do: the fewest of a few looks (a scrape of its
    metrics is served on a thread of its own that ends with the answer)."""
    seen: list[int] = []

    def enough() -> bool:
        seen.append(controller.threads())
        return len(seen) >= 10

    wait_until(enough, timeout=30, interval=0.3, what="a look at the controller's threads")
    return min(seen)


def test_flux_source_watches_are_bounded_by_the_kinds_the_operator_allows(
    start_controller: Callable[..., ControllerProcess],
    kube: Kube,
    namespace: str,
    gadget_rbac: None,
) -> None:
    """Issue 26, item 4: 30 Stacks naming made-up kinds took the controller from 20 to 50
    threads that stayed after the Stacks were deleted, retrying `list failed: 404` forever."""
    controller = start_controller(PKOBATCH_EXTRA_FLUX_SOURCE_KINDS="Gadget")
    controller.caught_up()
    baseline = idle_threads(controller)

    # Admission refuses any group but Flux's, and what is no kind name.
    for api_version, kind in (("example.invalid/v1", "Gadget"), ("v1", "Secret")):
        with pytest.raises(
            Invalid, match=re.escape("spec.fluxSource.sourceRef must name a Flux source")
        ):
            apply_stack(kube, namespace, "other-group", flux_spec(kind, api_version))
    with pytest.raises(
        Invalid, match=re.escape("spec.fluxSource.sourceRef.kind is not a kind name")
    ):
        apply_stack(kube, namespace, "not-a-kind", flux_spec("gadgets"))

    # Made-up kinds of Flux's group pass admission; the controller refuses them, watching none.
    made_up = [f"made-up-{index}" for index in range(30)]
    for index, name in enumerate(made_up):
        apply_stack(kube, namespace, name, flux_spec(f"MadeUp{index}"))
    for name in made_up:
        stalled = condition(wait_stack(kube, namespace, name, spec_invalid, timeout=120), "Stalled")
        assert "is not a Flux source kind this controller reads" in stalled["message"]
        assert "(GitRepository, OCIRepository, Bucket, Gadget)" in stalled["message"]
        assert "PKOBATCH_EXTRA_FLUX_SOURCE_KINDS" in stalled["message"]
    controller.caught_up()
    wait_until(
        lambda: controller.threads() <= baseline,
        timeout=60,
        what=f"the controller's threads to stay at {baseline} (no watch of a made-up kind)",
    )
    # A reflector names its resource (madeup<n>s) when it lists, watches or fails.
    assert re.search(r"madeup\d+s", controller.log_text().lower()) is None

    # An allowed kind the server does not serve: the Stack waits and says why; the watch
    # retries with backoff only while a Stack needs it.
    apply_stack(kube, namespace, "gadget", flux_spec("Gadget"))
    waiting = wait_stack(
        kube,
        namespace,
        "gadget",
        lambda s: "cannot list them" in condition(s, "Reconciling").get("message", ""),
        timeout=120,
    )
    message = condition(waiting, "Reconciling")["message"]
    assert condition(waiting, "Reconciling")["reason"] == "WaitingForSource"
    assert "Gadget (source.toolkit.fluxcd.io/v1)" in message and "404" in message
    wait_until(lambda: controller.threads() > baseline, timeout=60, what="the watch of Gadget")

    for name in [*made_up, "gadget"]:
        kube.delete(STACKS, name, namespace)
    wait_until(
        lambda: all(kube.get_or_none(STACKS, n, namespace) is None for n in [*made_up, "gadget"]),
        timeout=180,
        what="the Stacks to be gone",
    )
    wait_until(
        lambda: controller.threads() <= baseline,
        timeout=120,
        what=f"the controller's threads to return to {baseline} (the Gadget watch stopped)",
    )
