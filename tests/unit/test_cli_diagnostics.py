"""Verdicts of `pkobatch check` and `pkobatch version` (pure)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from pkobatch.api.crd import generate_crd
from pkobatch.cli.diagnostics import (
    COMMAND_PERMISSIONS,
    controller_deployments,
    controller_image,
    crd_differences,
    image_tag,
    leader_election,
    lease_state,
)
from pkobatch.kube.rbac import access_review

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_the_generated_crd_has_no_differences_even_with_server_defaults() -> None:
    installed = copy.deepcopy(generate_crd())
    installed["spec"]["conversion"] = {"strategy": "None"}
    installed["status"] = {"acceptedNames": {}}

    assert crd_differences(installed, generate_crd()) == []


def test_crd_differences_name_what_changed() -> None:
    installed = copy.deepcopy(generate_crd())
    installed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ].pop("suspend")
    installed["spec"]["versions"].pop(1)
    installed["spec"]["names"]["categories"] = []

    assert crd_differences(installed, generate_crd()) == [
        "spec.names.categories is [], expected ['pulumi']",
        "version v1: schema differs",
        "version v1alpha1 is missing",
    ]


def test_lease_state() -> None:
    lease = {
        "spec": {
            "holderIdentity": "pkobatch-controller-abc",
            "renewTime": "2026-11-30T11:59:50.000000Z",
            "leaseDurationSeconds": 35,
        }
    }

    held = lease_state(lease, NOW)
    expired = lease_state(lease, NOW + timedelta(minutes=1))
    released = lease_state({"spec": {"leaseDurationSeconds": 35}}, NOW)

    assert (held.holder, held.expired) == ("pkobatch-controller-abc", False)
    assert expired.expired
    assert released.expired


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("pkobatch/runner:0.1.0", "0.1.0"),
        ("registry:5000/pkobatch/runner:0.2.0", "0.2.0"),
        ("registry:5000/pkobatch/runner", "latest"),
        ("pkobatch/runner@sha256:abc", "sha256:abc"),
    ],
)
def test_image_tag(image: str, tag: str) -> None:
    assert image_tag(image) == tag


def test_controller_image_prefers_the_controller_container() -> None:
    deployment = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "proxy", "image": "proxy:1"},
                        {"name": "controller", "image": "pkobatch/runner:0.3.0"},
                    ]
                }
            }
        }
    }

    assert controller_image(deployment) == "pkobatch/runner:0.3.0"
    assert controller_image({}) == ""


def test_access_review_splits_subresources() -> None:
    review = access_review("", "pods/log", "get", "team")

    assert review["spec"]["resourceAttributes"] == {
        "group": "",
        "resource": "pods",
        "subresource": "log",
        "verb": "get",
        "namespace": "team",
    }
    assert (
        "namespace"
        not in access_review("pulumi.com", "stacks", "list", None)["spec"]["resourceAttributes"]
    )


def test_every_user_command_has_its_permissions_checked() -> None:
    from pkobatch.cli.commands import USER_COMMANDS

    covered = {name.strip() for names in COMMAND_PERMISSIONS for name in names.split(",")}
    cluster_free = {"check", "version", "completion"}

    assert {c.name for c in USER_COMMANDS} - cluster_free == covered


def deployment(*env: dict[str, str], env_from: bool = False) -> dict[str, object]:
    container: dict[str, object] = {"name": "controller", "env": list(env)}
    if env_from:
        container["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    return {"spec": {"template": {"spec": {"containers": [container]}}}}


def test_leader_election_is_read_from_the_controllers_environment() -> None:
    on = {"name": "PKOBATCH_LEADER_ELECTION__ENABLED", "value": "true"}
    off = {"name": "PKOBATCH_LEADER_ELECTION__ENABLED", "value": "0"}
    referenced = {"name": "PKOBATCH_LEADER_ELECTION__ENABLED", "valueFrom": {"x": {}}}

    assert leader_election(deployment(on)) is True
    assert leader_election(deployment({**on, "value": " Yes"})) is True
    assert leader_election(deployment(off)) is False
    # Unset: the controller's default, off.
    assert leader_election(deployment({"name": "OTHER", "value": "1"})) is False
    # The Deployment does not say.
    assert leader_election(deployment(referenced)) is None
    assert leader_election(deployment(env_from=True)) is None
    assert leader_election(deployment(off, env_from=True)) is False


def labelled(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels}}


def test_controller_deployments_are_told_apart_by_label_whatever_their_names() -> None:
    controller = "app.kubernetes.io/component"
    renamed = labelled("acme-pko-controller", **{controller: "controller"})
    second = labelled("zz-controller", **{controller: "controller"})
    blue = labelled(
        "acme-pko-controller-blue",
        **{controller: "controller-shard", "pkobatch.io/controller-shard": "blue"},
    )
    green = labelled(
        "x", **{controller: "controller-shard", "pkobatch.io/controller-shard": "green"}
    )
    unlabelled_shard = labelled("y", **{controller: "controller-shard"})

    found = controller_deployments([green, second, blue, unlabelled_shard, renamed])

    assert found.main is renamed
    assert found.shards == [("blue", blue), ("green", green)]
    assert controller_deployments([blue]).main is None
    assert controller_deployments([]).shards == []
