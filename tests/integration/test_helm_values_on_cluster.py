"""Chart values on the local control plane's real API server and kube-controller-manager.

The aggregation roles (``rbac.aggregateToDefaultRoles``): kube-controller-manager's
clusterrole-aggregation controller folds them into the built-in ``view`` and ``edit``
ClusterRoles, so a user bound to ``edit`` in one namespace creates Stacks there (and nowhere
else) and a user bound to ``view`` reads them but cannot create, change or delete one. The
users are users of the API server's RBAC (``kubectl --as``: the admin impersonates them, so
every request is authorized as that user and no group of the admin's).

The controller pod's security context: with ``podSecurityContext.runAsUser`` and
``runAsGroup`` removed (OpenShift's restricted-v2 assigns them), the pod still passes the
``restricted`` Pod Security Standard, checked by the API server's PodSecurity admission.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from helpers.deploy_render import KUBECTL, Obj, template

from pkobatch.dev.processes import wait_until

EDITOR = "jane@example.com"
VIEWER = "ann@example.com"
AGGREGATION_ROLES = ("pkobatch-view", "pkobatch-edit")


def kubectl(
    cluster: Any, *args: str, stdin: str = "", as_user: str | None = None
) -> subprocess.CompletedProcess[str]:
    impersonate = ["--as", as_user] if as_user else []
    return subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *impersonate, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def applied(cluster: Any, objects: list[Obj], *args: str) -> str:
    done = kubectl(cluster, "apply", "-f", "-", *args, stdin=yaml.safe_dump_all(objects))
    assert done.returncode == 0, done.stderr
    return done.stdout


def stack(name: str) -> Obj:
    # No controller watches this cluster's Stacks here: the objects are only stored.
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name},
        "spec": {
            "stack": "dev",
            "projectRepo": "https://git.example.com/infra",
            "branch": "main",
        },
    }


def create_stack(
    cluster: Any, user: str, namespace: str, name: str
) -> subprocess.CompletedProcess[str]:
    return kubectl(
        cluster,
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump(stack(name)),
        as_user=user,
    )


def bind(cluster: Any, namespace: str, user: str, cluster_role: str) -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{cluster_role}-{user.partition('@')[0]}", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role,
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    applied(cluster, [binding])


def may(cluster: Any, user: str, verb: str, namespace: str) -> bool:
    done = kubectl(
        cluster, "auth", "can-i", verb, "stacks.pulumi.com", "-n", namespace, as_user=user
    )
    return done.stdout.strip() == "yes"


def test_namespace_edit_users_create_stacks_and_view_users_only_read_them(
    cluster: Any, namespace: str, helm_bin: Path
) -> None:
    roles = [o for o in template(helm_bin) if o["metadata"]["name"] in AGGREGATION_ROLES]
    assert sorted(o["kind"] for o in roles) == ["ClusterRole", "ClusterRole"]
    try:
        bind(cluster, namespace, EDITOR, "edit")
        bind(cluster, namespace, VIEWER, "view")
        # The built-in roles alone know nothing of Stacks: the aggregation roles are the grant.
        assert not may(cluster, EDITOR, "create", namespace)
        assert not may(cluster, VIEWER, "list", namespace)
        applied(cluster, roles)
        wait_until(
            lambda: may(cluster, EDITOR, "create", namespace),
            timeout=120,
            what="the built-in edit role to aggregate pkobatch-edit",
        )
        wait_until(
            lambda: may(cluster, VIEWER, "list", namespace),
            timeout=120,
            what="the built-in view role to aggregate pkobatch-view",
        )

        created = create_stack(cluster, EDITOR, namespace, "website")
        assert created.returncode == 0, created.stderr
        assert "stack.pulumi.com/website created" in created.stdout
        patched = kubectl(
            cluster,
            "annotate",
            "-n",
            namespace,
            "stack/website",
            "pkobatch.io/reason=test",
            as_user=EDITOR,
        )
        assert patched.returncode == 0, patched.stderr

        listed = kubectl(cluster, "get", "stacks", "-n", namespace, "-o", "name", as_user=VIEWER)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split() == ["stack.pulumi.com/website"]
        refused = create_stack(cluster, VIEWER, namespace, "blog")
        assert refused.returncode != 0
        assert f'User "{VIEWER}" cannot create resource "stacks"' in refused.stderr
        deleted_by_viewer = kubectl(
            cluster, "delete", "-n", namespace, "stack/website", as_user=VIEWER
        )
        assert f'User "{VIEWER}" cannot delete resource "stacks"' in deleted_by_viewer.stderr

        # The binding is the namespace's: the editor creates no Stack anywhere else.
        elsewhere = create_stack(cluster, EDITOR, "default", "website")
        assert f'User "{EDITOR}" cannot create resource "stacks"' in elsewhere.stderr
        # Nor does either role reach the controller's part: Stack status.
        status = kubectl(
            cluster,
            "patch",
            "-n",
            namespace,
            "stack/website",
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status": {"lastUpdate": {"state": "succeeded"}}}',
            as_user=EDITOR,
        )
        assert 'cannot patch resource "stacks/status"' in status.stderr

        deleted = kubectl(cluster, "delete", "-n", namespace, "stack/website", as_user=EDITOR)
        assert deleted.returncode == 0, deleted.stderr
    finally:
        kubectl(cluster, "delete", "clusterrole", *AGGREGATION_ROLES, "--ignore-not-found")


def controller_pod(objects: list[Obj], namespace: str) -> Obj:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pkobatch-controller", "namespace": namespace},
        "spec": deployment["spec"]["template"]["spec"],
    }


def test_controller_pod_without_a_fixed_uid_passes_restricted_pod_security(
    cluster: Any, namespace: str, helm_bin: Path
) -> None:
    labelled = kubectl(
        cluster,
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
    )
    assert labelled.returncode == 0, labelled.stderr
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "pkobatch-controller", "namespace": namespace},
    }
    applied(cluster, [account])
    openshift = template(
        helm_bin,
        namespace=namespace,
        sets=[
            "controller.podSecurityContext.runAsUser=null",
            "controller.podSecurityContext.runAsGroup=null",
        ],
    )
    pod = controller_pod(openshift, namespace)
    assert "runAsUser" not in pod["spec"]["securityContext"]
    assert "pod/pkobatch-controller created (server dry run)" in applied(
        cluster, [pod], "--dry-run=server"
    )
    # The check is real: without the pod's security context (its seccomp profile) the
    # restricted standard refuses the pod.
    bare = controller_pod(
        template(helm_bin, namespace=namespace, sets=["controller.podSecurityContext=null"]),
        namespace,
    )
    assert "securityContext" not in bare["spec"]
    done = kubectl(cluster, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bare))
    assert done.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in done.stderr
    assert "seccompProfile" in done.stderr
