"""``pkobatch dev demo --node real``: the demo Stack run in a real container, with pkobatch
installed the way users install it.

Build what is missing (the control plane, the real node's components, the Pulumi tools the
runner image carries, then the runner and controller images of ``jobs/Dockerfile``) → start
the environment with the real node and no controller of its own (``pkobatch dev up --node
real --no-controller``) → import the images into the node's containerd (``pkobatch dev
load-image``) → ``kubectl apply -k`` of a kustomization on ``deploy/kustomize/base`` that
names the built images, as docs/install.md's does, and wait for the controller's rollout →
a ``Program`` (Pulumi YAML: a config value, a secret one, outputs) and a Stack running it
whose ``file://`` backend is a hostPath PersistentVolume on the node → wait until the Stack
is Ready, then print where its run ran: the pod's node, image and container status.

Why a Program and a PersistentVolume: a run's container sees nothing of the host, so the
default demo's ``file://`` repository, backend and files' directory do not reach it. A
Program travels in the run's snapshot; the PersistentVolume (``<state>/demo/state``,
writable by the runner's uid 1000) keeps the stack's state past the run's pod.

The environment keeps running at the end, also after a failed step (it takes minutes to
make and is there to be looked at): the demo prints how to look around and how to stop it
(``pkobatch dev down``, which also removes the node's network).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml
from rich.table import Table

from pkobatch.api.constants import RUN_CONTAINER_NAME
from pkobatch.api.objects import JSON
from pkobatch.api.status import last_update
from pkobatch.dev import supervisor
from pkobatch.dev.controlplane import repo_root
from pkobatch.dev.demo import DEMO_COMPONENTS, NAMESPACE, STACK, Demo, DemoFailed
from pkobatch.dev.images import BuilderMissing, BuiltImage, ImageBuildFailed, build_images, tools_of
from pkobatch.dev.tools import NODE_TOOLS, ToolsMissing, find_tools
from pkobatch.kube.client import PERSISTENTVOLUMES, PODS, STACKS, Kube

CONTROLLER_NAMESPACE: Final = "pkobatch-system"
CONTROLLER_DEPLOYMENT: Final = "pkobatch-controller"
IMAGE_TARGETS: Final = ("runner", "controller")
STATE_MOUNT: Final = "/state"
STATE_CLAIM: Final = "demo-state"
STATE_VOLUME: Final = f"{NAMESPACE}-state"
RUN_AS: Final = 1000
"""The runner image's user (jobs/Dockerfile), who writes the state."""
PROGRAM: Final[JSON] = {
    "configuration": {"greeting": {"type": "String"}, "token": {"type": "String"}},
    "outputs": {
        "message": "${greeting} from a real container",
        "token": {"fn::secret": "${token}"},
    },
}
# A controller pod whose container waits for one of these will not recover by itself.
_STUCK: Final = ("CrashLoopBackOff", "ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull")


@dataclass
class RealNodeDemo(Demo):
    images: dict[str, BuiltImage] = field(default_factory=dict)
    kubeconfig: Path | None = None

    @property
    def state_dir(self) -> Path:
        """The host directory behind the stack's state (the PersistentVolume's hostPath)."""
        return self.work / "state"

    @property
    def install_dir(self) -> Path:
        """Where the demo writes the kustomization it installs pkobatch with."""
        return self.root / "install"

    # -- steps ----------------------------------------------------------------------------

    def build(self) -> None:
        components = (*DEMO_COMPONENTS, *NODE_TOOLS, *tools_of("runner"))
        self.build_tools(tuple(dict.fromkeys(components)))
        self.console.print(f"building (or reusing) the images {', '.join(IMAGE_TARGETS)} …")
        try:
            self.images = build_images(IMAGE_TARGETS, progress=True)
        except (BuilderMissing, ImageBuildFailed, ToolsMissing) as exc:
            raise DemoFailed(str(exc)) from exc
        for image in self.images.values():
            size = image.unpacked_bytes / 1e6
            self.console.print(f"[green]✓[/] image {image.reference} ({size:.0f} MB unpacked)")

    def start_environment(self) -> None:
        status = supervisor.read_status(self.root)
        if status.get("state") == "running":
            controller = (status.get("controller") or {}).get("state")
            if status.get("node") != "real" or controller != "disabled":
                raise DemoFailed(
                    f"the dev environment in {self.root} is not a real node without a "
                    f"controller of its own (node: {status.get('node')}, controller: "
                    f"{controller}); stop it with `pkobatch dev down --state-dir {self.root}` "
                    "or use another --state-dir"
                )
            self.console.print(f"using the real node already running in {self.root}")
        else:
            self.console.print(f"starting the dev environment with a real node in {self.root} …")
            self.started_environment = True
            status = supervisor.up(
                self.root, node="real", with_controller=False, timeout=self.timeout
            )
        self.kubeconfig = Path(status["kubeconfig"])
        self.kube = Kube.connect(str(self.kubeconfig))
        self.console.print(
            f"[green]✓[/] control plane at {status['server']}, node "
            f"{', '.join(status.get('nodeComponents') or {})} running"
        )

    def load_images(self) -> None:
        archives = [image.archive for image in self.images.values()]
        supervisor.load_images(self.root, archives)
        names = ", ".join(image.reference for image in self.images.values())
        self.console.print(f"[green]✓[/] imported {names} into the node's containerd")

    def install(self) -> None:
        """``kubectl apply -k`` of docs/install.md's kustomization, on the checkout's base and
        with the built images in place of the user's registry."""
        root = repo_root()
        assert root is not None
        self.install_dir.mkdir(parents=True, exist_ok=True)
        base = os.path.relpath(root / "deploy" / "kustomize" / "base", self.install_dir)
        controller, _, tag = self.images["controller"].reference.rpartition(":")
        patch = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": CONTROLLER_DEPLOYMENT},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "controller",
                                "env": [
                                    {
                                        "name": "PKOBATCH_JOB__IMAGE",
                                        "value": self.images["runner"].reference,
                                    }
                                ],
                            }
                        ]
                    }
                }
            },
        }
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [base],
            "images": [{"name": "pkobatch/controller", "newName": controller, "newTag": tag}],
            "patches": [
                {
                    "target": {"kind": "Deployment", "name": CONTROLLER_DEPLOYMENT},
                    "patch": yaml.safe_dump(patch, sort_keys=False),
                }
            ],
        }
        path = self.install_dir / "kustomization.yaml"
        path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
        self._kubectl("apply", "-k", str(self.install_dir))
        self._kubectl(
            "-n",
            CONTROLLER_NAMESPACE,
            "rollout",
            "status",
            f"deployment/{CONTROLLER_DEPLOYMENT}",
            f"--timeout={self.timeout:.0f}s",
        )
        self.console.print(f"[green]✓[/] the controller runs as a pod ({path})")

    def remove_previous_run(self) -> None:
        super().remove_previous_run()
        # Its claim went with the namespace; a Retained volume cannot be bound again.
        kube = self._kube()
        if kube.get_or_none(PERSISTENTVOLUMES, STATE_VOLUME) is not None:
            kube.delete(PERSISTENTVOLUMES, STATE_VOLUME)
            self._wait_gone(PERSISTENTVOLUMES, STATE_VOLUME, None)

    def prepare_state(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        self.state_dir.mkdir(parents=True)
        os.chown(self.state_dir, RUN_AS, RUN_AS)
        self.console.print(f"[green]✓[/] state directory {self.state_dir} (uid {RUN_AS})")

    def show_run(self) -> None:
        """The run pod of the Stack's last update: its node, image and container status."""
        kube = self._kube()
        job = last_update(kube.get(STACKS, STACK, NAMESPACE).get("status")).get("name")
        pods, _ = kube.list_objects(PODS, NAMESPACE, label_selector=f"job-name={job}")
        succeeded = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
        if not succeeded:
            raise DemoFailed(f"no pod of the Job {job} succeeded{self._where_to_look(job)}")
        pod = succeeded[0]
        statuses = pod["status"].get("containerStatuses") or []
        (container,) = [s for s in statuses if s["name"] == RUN_CONTAINER_NAME]
        terminated = (container.get("state") or {}).get("terminated") or {}
        table = Table(
            title=f"the run: pod {NAMESPACE}/{pod['metadata']['name']}", show_header=False
        )
        table.add_column(style="bold")
        table.add_column()
        table.add_row("node", str(pod["spec"].get("nodeName")))
        table.add_row("image", str(container.get("image")))
        table.add_row("image ID", str(container.get("imageID")))
        table.add_row("container ID", str(container.get("containerID")))
        table.add_row(
            "container",
            f"terminated: {terminated.get('reason')}, exit code {terminated.get('exitCode')}",
        )
        self.console.print(table)

    def explain(self) -> None:
        """How to look at what the demo made, and how to stop it."""
        kubectl = Path(find_tools(("node",)).binary("node", "kubectl"))
        job = last_update(self._kube().get(STACKS, STACK, NAMESPACE).get("status")).get("name")
        # Not wrapped: each line is a command to copy.
        self.console.print(
            "\nThe environment keeps running. Look around:\n"
            f"  export KUBECONFIG={self.kubeconfig} PATH={kubectl.parent}:$PATH\n"
            "  kubectl get nodes -o wide\n"
            f"  kubectl -n {NAMESPACE} get stacks,programs,jobs,pods -o wide\n"
            f"  kubectl -n {NAMESPACE} logs job/{job}    # the run's log, read from the kubelet\n"
            f"  kubectl -n {CONTROLLER_NAMESPACE} logs deployment/{CONTROLLER_DEPLOYMENT}\n"
            f"  pkobatch get -n {NAMESPACE}\n"
            f"Stop it (the node's containers, its network namespace and bridge go too):\n"
            f"  pkobatch dev down --state-dir {self.root}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )

    # -- overrides of the default demo ----------------------------------------------------

    def steps(self) -> tuple[Callable[[], None], ...]:
        return (
            self.build,
            self.start_environment,
            self.load_images,
            self.install,
            self.remove_previous_run,
            self.prepare_state,
            self.apply_objects,
            self.wait_for_up,
            self.show_run,
            self.explain,
        )

    def _objects(self) -> list[JSON]:
        volume: JSON = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": STATE_VOLUME},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(self.state_dir), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": STATE_CLAIM},
            },
        }
        claim: JSON = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": STATE_CLAIM, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": STATE_VOLUME,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        program: JSON = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Program",
            "metadata": {"name": STACK, "namespace": NAMESPACE},
            "program": PROGRAM,
        }
        return [*self._namespace_objects(), volume, claim, program, self._stack()]

    def _source(self) -> JSON:
        return {
            "programRef": {"name": STACK},
            "backend": f"file://{STATE_MOUNT}",
            "config": {"greeting": "kia ora"},
            "jobTemplate": {
                "spec": {
                    "volumes": [
                        {"name": "state", "persistentVolumeClaim": {"claimName": STATE_CLAIM}}
                    ],
                    "containers": [
                        {
                            "name": RUN_CONTAINER_NAME,
                            "volumeMounts": [{"name": "state", "mountPath": STATE_MOUNT}],
                        }
                    ],
                }
            },
        }

    def _check_controller(self, environment: JSON) -> None:
        pods, _ = self._kube().list_objects(
            PODS, CONTROLLER_NAMESPACE, label_selector="app.kubernetes.io/component=controller"
        )
        for pod in pods:
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                waiting = (status.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in _STUCK:
                    raise DemoFailed(
                        f"the controller pod {pod['metadata']['name']} is stuck: "
                        f"{waiting.get('reason')}: {waiting.get('message', '')}"
                        f"{self._where_to_look(None)}"
                    )

    def _where_to_look(self, job: str | None) -> str:
        run = (
            f"kubectl -n {NAMESPACE} logs job/{job}" if job else f"kubectl -n {NAMESPACE} get pods"
        )
        return (
            f"\n  run: KUBECONFIG={self.kubeconfig} {run}"
            f"\n  controller: kubectl -n {CONTROLLER_NAMESPACE} logs "
            f"deployment/{CONTROLLER_DEPLOYMENT}"
        )

    def _kubectl(self, *args: str) -> None:
        """Run the built kubectl on the demo's cluster, showing the command and its output."""
        kubectl = find_tools(("node",)).binary("node", "kubectl")
        self.console.print(f"$ kubectl {' '.join(args)}", style="dim", soft_wrap=True)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        try:
            done = subprocess.run(
                [kubectl, *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DemoFailed(
                f"kubectl {' '.join(args)} still ran after {exc.timeout:.0f}s"
            ) from exc
        if done.returncode != 0:
            raise DemoFailed(
                f"kubectl {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}{self._where_to_look(None)}"
            )
        self.console.print(
            done.stdout.rstrip(), style="dim", markup=False, highlight=False, soft_wrap=True
        )
