"""Memory of the controller's cache for N Stacks with H runs of history each: as the
controller keeps it (reflector transforms of ``pkobatch.controller.cache_transforms``, finished runs
packed), with the transforms but nothing packed, and with neither, side by side.

    .venv/bin/python bench/cache_memory.py [--stacks 10000] [--history 5]

No API server: each variant runs in a fresh process that makes the JSON the API server would
send — N Stacks (status as the controller writes it after a run), N x H Jobs (built by the
controller's own Job builder, complete) and N x H result ConfigMaps, each with the metadata
the API server adds (uid, resourceVersion, creationTimestamp, managedFields of the writer
and of the status writer) — and fills the variant's stores (indexed by Stack:
``Stores.empty()`` for the controller's, the same stores without packing for the others) the
way the reflector's start-up list does: page by page (500 objects), every object through the
variant's transform into a store entry (packed there if the store packs it), each store
replaced with all its entries at the end, the reported changes read out one at a time. It
reports the process's resident memory before and after (what decoding left fragmented
included, as in the controller), with ``--live`` also the live bytes the stores hold. This
is the part of the controller's memory that grows with Stacks and history;
``bench/fanout.py`` measures the whole controller process on a real control plane.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
PAGE = 500
# The controller's stores; transforms without packing; neither (slim only).
VARIANTS = ("controller", "unpacked", "untransformed")
NAMESPACE = "team"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fields_v1(value: Any) -> Any:
    """The managedFields shape of ``value`` (the API server's fieldsV1 set)."""
    if isinstance(value, dict):
        return {f"f:{key}": fields_v1(item) for key, item in value.items()}
    return {}


def served(obj: JSON, index: int, writers: tuple[str, str]) -> JSON:
    """``obj`` with the metadata the API server adds."""
    meta = obj["metadata"]
    meta.update(
        namespace=NAMESPACE,
        uid=str(uuid.uuid4()),
        resourceVersion=str(100000 + index),
        creationTimestamp="2026-01-01T00:00:00Z",
        generation=1,
    )
    creator, status_writer = writers
    spec_fields = {key: value for key, value in obj.items() if key != "status"}
    meta["managedFields"] = [
        {
            "manager": creator,
            "operation": "Update",
            "apiVersion": obj["apiVersion"],
            "time": "2026-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1(spec_fields),
        },
        {
            "manager": status_writer,
            "operation": "Update",
            "apiVersion": obj["apiVersion"],
            "time": "2026-01-01T00:05:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1({"status": obj.get("status", {})}),
            "subresource": "status",
        },
    ]
    return obj


def stack(name: str) -> JSON:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {
            "name": name,
            "finalizers": ["finalizer.stack.pulumi.com"],
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                    {"apiVersion": "pulumi.com/v1", "kind": "Stack", "spec": {"stack": "dev"}}
                )
            },
        },
        "spec": {"stack": "dev"},
        "status": {
            "observedGeneration": 1,
            "observedReconcileRequest": "",
            "lastUpdate": {
                "generation": 1,
                "name": f"{name}-up-0123456789",
                "type": "up",
                "state": "succeeded",
                "message": "",
                "lastAttemptedCommit": "",
                "lastSuccessfulCommit": "",
                "lastResyncTime": "2026-01-01T00:05:00Z",
                "failures": 0,
            },
            "outputs": {"stack": name},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "ProcessingCompleted",
                    "message": "the stack has been processed and is up to date",
                    "lastTransitionTime": "2026-01-01T00:05:00Z",
                    "observedGeneration": 1,
                }
            ],
        },
    }


def history(stack_obj: JSON, runs: int) -> Iterator[tuple[JSON, JSON]]:
    """(Job, result ConfigMap) of each of ``runs`` finished runs of ``stack_obj``."""
    from pkobatch.api.run import Run
    from pkobatch.api.stack.spec import StackSpec
    from pkobatch.config import Settings
    from pkobatch.controller.job_builder import build_run, builtin_template

    settings, template = Settings().job, builtin_template()
    for index in range(runs):
        run = Run("up", "sync", 1, "", "", f"history:{index}")
        job = build_run(stack_obj, StackSpec(stack="dev"), run, settings, template).job
        job["status"] = {
            "startTime": "2026-01-01T00:00:00Z",
            "completionTime": "2026-01-01T00:05:00Z",
            "succeeded": 1,
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "lastProbeTime": "2026-01-01T00:05:00Z",
                    "lastTransitionTime": "2026-01-01T00:05:00Z",
                    "reason": "CompletionsReached",
                    "message": "Reached expected number of succeeded pods",
                }
                for kind in ("SuccessCriteriaMet", "Complete")
            ],
            "uncountedTerminatedPods": {},
        }
        job = served(job, index, ("pkobatch-controller", "kube-controller-manager"))
        meta = job["metadata"]
        result = {
            "schemaVersion": "pkobatch.io/run-result/v1",
            "operation": "up",
            "state": "succeeded",
            "reason": "Succeeded",
            "message": "",
            "stack": {
                "name": stack_obj["metadata"]["name"],
                "namespace": NAMESPACE,
                "uid": stack_obj["metadata"]["uid"],
            },
            "jobName": meta["name"],
            "generation": 1,
            "commit": "0123456789abcdef0123456789abcdef01234567",
            "startTime": "2026-01-01T00:00:00Z",
            "endTime": "2026-01-01T00:05:00Z",
            "outputs": {"stack": stack_obj["metadata"]["name"]},
            "changes": {"same": 3, "update": 1},
            "permalink": "",
            "pulumiVersion": "3.259.0",
            "projectInfo": {"name": "app", "runtime": "python"},
            "languageHost": "pulumi-language-python",
        }
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": meta["name"],
                "labels": {**meta["labels"], "pkobatch.io/result": "succeeded"},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": {"result.json": json.dumps(result)},
        }
        yield job, served(configmap, index, ("pkobatch-runner", "pkobatch-runner"))


def pages(objects: list[JSON]) -> Iterator[bytes]:
    for start in range(0, len(objects), PAGE):
        yield json.dumps({"items": objects[start : start + PAGE]}).encode()


def measure(variant: str, count: int, runs: int, live: bool) -> None:
    """One variant in this process: prints the cache's RSS growth in MiB."""
    from pkobatch.controller.cache_transforms import cache_job, cache_result, cache_stack
    from pkobatch.controller.stores import Stores, stack_name_of
    from pkobatch.runtime.store import Entry, Store, slim

    transforms: dict[str, tuple[Callable[[JSON], JSON], ...]] = {
        "controller": (cache_stack, cache_job, cache_result),
        "unpacked": (cache_stack, cache_job, cache_result),
        "untransformed": (slim, slim, slim),
    }
    to_stack, to_job, to_result = transforms[variant]
    stores = Stores.empty()
    if variant != "controller":
        stores.jobs, stores.configmaps = Store(stack_name_of), Store(stack_name_of)
    # Everything imported and built once before the first reading (the Job builder's
    # modules are a large part of the process).
    for _ in history(served(stack("warm-up"), 0, ("kubectl", "kubectl")), 1):
        pass
    # The served JSON is made and encoded in batches of Stacks, so what the process holds
    # at the end is the stores, not the input.
    gc.collect()
    if live:
        tracemalloc.start()
    before = rss_mib()
    batch = 100
    listed: dict[str, list[Entry]] = {"stacks": [], "jobs": [], "results": []}
    for first in range(0, count, batch):
        stacks, jobs, results = [], [], []
        for index in range(first, min(count, first + batch)):
            stack_obj = served(stack(f"s{index:05d}"), index, ("kubectl", "pkobatch-controller"))
            stacks.append(stack_obj)
            for job, result in history(stack_obj, runs):
                jobs.append(job)
                results.append(result)
        for kind, objects, store, transform in (
            ("stacks", stacks, stores.stacks, to_stack),
            ("jobs", jobs, stores.jobs, to_job),
            ("results", results, stores.configmaps, to_result),
        ):
            # As the reflector lists: each item transformed (and packed) as its page
            # arrives, the store replaced once the list is complete.
            for page in list(pages(objects)):
                for item in json.loads(page)["items"]:
                    listed[kind].append(store.entry(transform(item)))
        del stacks, jobs, results
    for kind, store in (
        ("stacks", stores.stacks),
        ("jobs", stores.jobs),
        ("results", stores.configmaps),
    ):
        changed, _ = store.replace(listed.pop(kind))
        for _, new in changed:  # what the reflector reports, one object at a time
            stack_name_of(new)
    gc.collect()
    after = rss_mib()
    held = tracemalloc.get_traced_memory()[0] if live else 0
    print(json.dumps({"variant": variant, "before": before, "after": after, "live": held}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", type=int, default=10000)
    parser.add_argument("--history", type=int, default=5)
    parser.add_argument(
        "--live",
        action="store_true",
        help="also count the live bytes the stores hold (tracemalloc: slower, and its own "
        "bookkeeping inflates the RSS figures)",
    )
    args = parser.parse_args()
    print(f"cache of {args.stacks} Stacks with {args.history} runs of history each", flush=True)
    grown = {}
    for variant in VARIANTS:
        output = subprocess.run(
            [
                sys.executable,
                __file__,
                "--measure",
                variant,
                str(args.stacks),
                str(args.history),
                "live" if args.live else "rss",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        figures = json.loads(output.strip().splitlines()[-1])
        grown[variant] = figures["after"] - figures["before"]
        held = f"; the stores hold {figures['live'] / 2**20:.0f} MiB live" if args.live else ""
        print(
            f"{variant}: RSS {figures['before']:.0f} MiB before, {figures['after']:.0f} MiB "
            f"after (+{grown[variant]:.0f} MiB){held}",
            flush=True,
        )
    for variant in VARIANTS[:-1]:
        print(f"ratio {variant} / untransformed: {grown[variant] / grown['untransformed']:.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--measure":
        measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "live")
    else:
        main()
