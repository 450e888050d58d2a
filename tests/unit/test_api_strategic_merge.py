"""The strategic merge of pod templates (pkobatch.api.strategic_merge), rule by rule.

The same merge is compared with the real API server's in
tests/integration/test_strategic_merge_server.py; these tests pin each rule and its errors.
"""

from typing import Any

import pytest

from pkobatch.api.strategic_merge import (
    POD_SPEC,
    POD_TEMPLATE_LISTS,
    StrategicMergeError,
    strategic_merge,
)


def pod(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


RUN = {
    "name": "pulumi",
    "image": "runner",
    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
    "volumeMounts": [{"name": "share", "mountPath": "/share"}],
    "ports": [{"containerPort": 80, "protocol": "TCP"}],
}
BASE = {
    "metadata": {"labels": {"app": "x"}, "finalizers": ["a", "b"]},
    "spec": {
        "containers": [RUN],
        "volumes": [{"name": "share", "emptyDir": {}}],
        "tolerations": [{"key": "t1", "operator": "Exists"}],
        "nodeSelector": {"pool": "a"},
    },
}


def spec_of(patch: dict[str, Any]) -> Any:
    return strategic_merge(BASE, patch)["spec"]


def test_lists_with_a_merge_key_merge_item_by_item_in_apimachinerys_order() -> None:
    merged = spec_of(
        pod(containers=[{"name": "pulumi", "env": [{"name": "B", "value": "3"}, {"name": "C"}]}])
    )
    [run] = merged["containers"]
    # A base item goes first where the base places it before a patch item; items only the
    # patch has come first otherwise.
    assert run["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C"}]
    assert run["image"] == "runner"
    sidecar = spec_of(pod(containers=[{"name": "side", "image": "s"}]))["containers"]
    assert [c["name"] for c in sidecar] == ["side", "pulumi"]


def test_volume_mounts_merge_by_mount_path_not_by_name() -> None:
    mounts = spec_of(
        pod(
            containers=[
                {"name": "pulumi", "volumeMounts": [{"name": "other", "mountPath": "/share"}]}
            ]
        )
    )["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "other", "mountPath": "/share"}]


def test_lists_without_a_strategy_are_replaced() -> None:
    merged = spec_of(pod(tolerations=[{"key": "t2", "operator": "Exists"}]))
    assert merged["tolerations"] == [{"key": "t2", "operator": "Exists"}]
    args = spec_of(pod(containers=[{"name": "pulumi", "args": ["x"]}]))["containers"][0]
    assert args["args"] == ["x"]


def test_maps_merge_and_null_deletes_a_key() -> None:
    merged = strategic_merge(
        BASE, {"metadata": {"labels": {"app": None, "team": "t"}}, "spec": {"nodeSelector": None}}
    )
    assert merged["metadata"]["labels"] == {"team": "t"}
    assert "nodeSelector" not in merged["spec"]
    # A null the base has nothing for is dropped, not kept.
    assert "hostname" not in spec_of(pod(hostname=None))


def test_patch_delete_removes_a_list_item_or_a_map() -> None:
    merged = spec_of(
        pod(volumes=[{"name": "share", "$patch": "delete"}], nodeSelector={"$patch": "delete"})
    )
    assert merged["volumes"] == []
    assert merged["nodeSelector"] == {}


def test_patch_replace_replaces_a_list_or_a_map() -> None:
    merged = spec_of(
        pod(
            containers=[
                {"name": "pulumi", "env": [{"$patch": "replace"}, {"name": "Z", "value": "z"}]}
            ],
            nodeSelector={"$patch": "replace", "pool": "b", "zone": "z"},
        )
    )
    assert merged["containers"][0]["env"] == [{"name": "Z", "value": "z"}]
    assert merged["nodeSelector"] == {"pool": "b", "zone": "z"}


def test_retain_keys_clears_the_fields_it_does_not_name() -> None:
    volume = {"name": "share", "$retainKeys": ["name", "configMap"], "configMap": {"name": "c"}}
    assert spec_of(pod(volumes=[volume]))["volumes"] == [
        {"name": "share", "configMap": {"name": "c"}}
    ]
    with pytest.raises(StrategicMergeError, match="not in its \\$retainKeys"):
        spec_of(pod(volumes=[{**volume, "secret": {"secretName": "s"}}]))


def test_set_element_order_orders_the_merged_list() -> None:
    merged = spec_of(
        pod(
            **{
                "$setElementOrder/containers": [{"name": "pulumi"}, {"name": "side"}],
                "containers": [{"name": "side", "image": "s"}],
            }
        )
    )
    assert [c["name"] for c in merged["containers"]] == ["pulumi", "side"]
    with pytest.raises(StrategicMergeError, match="does not match"):
        spec_of(
            {"$setElementOrder/containers": [{"name": "pulumi"}], "containers": [{"name": "x"}]}
        )


def test_set_element_order_with_a_deletion_orders_by_the_base_as_apimachinery_leaves_it() -> None:
    env = [{"name": n, "value": n} for n in ("A", "B", "C", "D")]
    base = pod(containers=[{"name": "pulumi", "env": env}])
    patch = pod(
        containers=[
            {
                "name": "pulumi",
                "$setElementOrder/env": [{"name": "NEW"}, {"name": "A"}],
                "env": [{"name": "NEW", "value": "n"}, {"name": "B", "$patch": "delete"}],
            }
        ]
    )
    merged = strategic_merge(base, patch)["spec"]["containers"][0]["env"]
    # Deleting B shifts C and D left in apimachinery's base slice and NEW lands in the freed
    # last place, so C and D now rank before NEW: they come first.
    assert [e["name"] for e in merged] == ["C", "D", "NEW", "A"]


def test_delete_from_primitive_list_and_scalar_lists_merge_as_sets() -> None:
    merged = strategic_merge(
        BASE, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["b", "c"]}}
    )
    assert merged["metadata"]["finalizers"] == ["b", "c"]


def test_no_directive_survives_the_merge() -> None:
    # A new list item is taken as it is (its inner $patch is not applied), a replaced list
    # too; the directive keys go as the server's typed decoding drops them.
    merged = spec_of(
        pod(
            volumes=[{"name": "new", "emptyDir": {"$patch": "delete"}, "$retainKeys": ["name"]}],
            tolerations=[{"key": "k", "$patch": "delete"}],
        )
    )
    assert merged["volumes"][0] == {"name": "new", "emptyDir": {}}
    assert merged["tolerations"] == [{"key": "k"}]


def test_the_pod_spec_root_finds_the_same_lists() -> None:
    merged = strategic_merge(
        BASE["spec"], {"containers": [{"name": "side", "image": "s"}]}, POD_SPEC
    )
    assert [c["name"] for c in merged["containers"]] == ["side", "pulumi"]


def test_a_map_the_base_shares_between_places_is_merged_in_one_place_only() -> None:
    shared = {"name": "PULUMI_ENV", "value": "/share/.env"}
    base = pod(
        initContainers=[{"name": "init", "env": [shared]}],
        containers=[{"name": "pulumi", "env": [shared]}],
    )
    patch = pod(containers=[{"name": "pulumi", "env": [{"name": "PULUMI_ENV", "value": "x"}]}])
    merged = strategic_merge(base, patch)["spec"]
    assert merged["initContainers"][0]["env"] == [shared]
    assert merged["containers"][0]["env"] == [{"name": "PULUMI_ENV", "value": "x"}]


def test_inputs_are_not_modified() -> None:
    patch = pod(containers=[{"name": "pulumi", "env": [{"$patch": "replace"}]}])
    before = repr(BASE), repr(patch)
    strategic_merge(BASE, patch)
    assert (repr(BASE), repr(patch)) == before


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (pod(containers=[{"image": "no-name"}]), "has no merge key 'name'"),
        (pod(nodeSelector={"$patch": "merge"}), "unknown \\$patch 'merge'"),
        (pod(volumes=[{"name": "v", "$patch": "merge"}]), "not allowed in a list item"),
        (pod(volumes=[{"name": "v", "$patch": "explode"}]), "unknown \\$patch 'explode'"),
        (pod(containers=["pulumi"]), "not all of one type"),
        (pod(volumes=[{"name": "share", "$retainKeys": "name"}]), "must be a list"),
        ({"spec": {"$setElementOrder": []}}, "must be \\$setElementOrder/<list field>"),
    ],
)
def test_invalid_patches_are_refused_where_they_are_wrong(
    patch: dict[str, Any], message: str
) -> None:
    with pytest.raises(StrategicMergeError, match=message) as refused:
        strategic_merge(BASE, patch)
    assert str(refused.value).startswith("spec")


def test_the_table_names_every_container_list_of_every_container_kind() -> None:
    for containers in ("initContainers", "containers", "ephemeralContainers"):
        assert POD_TEMPLATE_LISTS[f"spec.{containers}"].merge_key == "name"
        for field, key in (
            ("env", "name"),
            ("volumeMounts", "mountPath"),
            ("ports", "containerPort"),
        ):
            assert POD_TEMPLATE_LISTS[f"spec.{containers}.{field}"].merge_key == key
    assert POD_TEMPLATE_LISTS["spec.volumes"].strategy == "merge,retainKeys"
    assert "spec.tolerations" not in POD_TEMPLATE_LISTS
