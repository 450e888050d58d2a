"""Every target of jobs/Dockerfile, built with buildah on the stand-in bases
(pkobatch.dev.images) and checked from its OCI archive: configuration, user, and commands run
in a container made from the archive."""

from __future__ import annotations

import json
import tarfile

import pytest
from fixture_plugins.images import Containers, ImageContainer, Images

from pkobatch import __version__
from pkobatch.config import JobSettings
from pkobatch.dev.images import TARGETS, BuiltImage, build_images, image_config
from pkobatch.dev.oci import CONTAINERD_NAME_ANNOTATION, REF_NAME_ANNOTATION
from pkobatch.dev.tools import versions

# What a run's pod would find of a language runtime: none of these may be in the controller.
LANGUAGE_RUNTIMES = ("pulumi", "node", "npm", "go", "dotnet", "java", "pulumi-language-yaml")


def config_of(image: BuiltImage) -> dict[str, object]:
    config = image_config(image.archive)["config"]
    assert isinstance(config, dict)
    return config


def succeeded(container: ImageContainer, *argv: str) -> str:
    done = container.run(*argv)
    assert done.returncode == 0, f"{argv} failed ({done.returncode}): {done.stderr}"
    return done.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_is_an_oci_archive_named_as_the_install_names_it(
    built_images: Images, target: str
) -> None:
    image = built_images[target]
    with tarfile.open(image.archive) as archive:
        index_file = archive.extractfile("index.json")
        assert index_file is not None
        (manifest,) = json.load(index_file)["manifests"]
    assert manifest["annotations"][REF_NAME_ANNOTATION] == image.reference
    # What `ctr images import` names the image by.
    assert manifest["annotations"][CONTAINERD_NAME_ANNOTATION] == image.reference
    assert image.reference == f"docker.io/pkobatch/{target}:{__version__}"
    assert 0 < image.archive_bytes < image.unpacked_bytes


def test_a_second_build_comes_from_the_cache(built_images: Images) -> None:
    again = build_images(list(built_images.built))
    assert {t: i.archive for t, i in again.items()} == {
        t: i.archive for t, i in built_images.built.items()
    }
    assert all(image.cached for image in again.values())


def test_the_runner_runs_pkobatch_and_the_pulumi_cli_as_uid_1000(
    built_images: Images, image_containers: Containers
) -> None:
    config = config_of(built_images["runner"])
    assert config["User"] == "1000:1000"
    assert not config.get("Entrypoint")
    assert config["Cmd"] == ["pkobatch", "--help"]
    assert "PKOBATCH_CACHE_DIR=/var/cache/pkobatch" in config["Env"]  # type: ignore[operator]
    runner = image_containers["runner"]
    assert succeeded(runner, "id", "-u").strip() == "1000"
    assert succeeded(runner, "pkobatch", "--version").strip() == f"pkobatch, version {__version__}"
    assert succeeded(runner, "pulumi", "version").strip() == f"v{versions()['PULUMI_VERSION']}"
    launcher = f"{JobSettings().runner_bundle}/pkobatch-runner"
    assert __version__ in succeeded(runner, launcher, "--version")
    # The runner's own virtualenv has the Pulumi SDK the Automation API needs.
    succeeded(runner, "/opt/pkobatch/venv/bin/python", "-c", "import pulumi.automation")


def test_the_runner_bundle_image_copies_the_bundle_as_its_init_container_does(
    built_images: Images, image_containers: Containers
) -> None:
    assert config_of(built_images["runner-bundle"])["User"] == "65532:65532"
    container = image_containers["runner-bundle"]
    # The init container's command (controller/job_builder.py), into a directory the user may write.
    succeeded(container, "cp", "-R", JobSettings().runner_bundle, "/tmp/runner")
    # The copy starts even here, in an image with no C library: it brings its own.
    assert __version__ in succeeded(container, "/tmp/runner/pkobatch-runner", "--version")


def test_the_controller_image_runs_the_controller_without_pulumi_or_language_runtimes(
    built_images: Images, image_containers: Containers
) -> None:
    config = config_of(built_images["controller"])
    assert config["User"] == "65532:65532"
    assert config["Cmd"] == ["pkobatch", "controller"]
    controller = image_containers["controller"]
    assert succeeded(controller, "id", "-u").strip() == "65532"
    assert "Run the Stack controller" in succeeded(controller, "pkobatch", "controller", "--help")
    installed = succeeded(controller, "/opt/pkobatch/venv/bin/python", "-m", "pip", "list")
    names = {line.split()[0].lower() for line in installed.splitlines()[2:]}
    assert {"pkobatch", "kubernetes", "pydantic"} <= names
    assert names.isdisjoint({"pulumi", "grpcio", "protobuf"}), sorted(names)
    # Asked on stdout: buildah run lost the traceback of a failed import once (stderr held
    # only its own "exit status 1").
    sdk = "import importlib.util; print(importlib.util.find_spec('pulumi'))"
    assert succeeded(controller, "/opt/pkobatch/venv/bin/python", "-c", sdk).strip() == "None"
    found = controller.run(
        "sh", "-c", f"for p in {' '.join(LANGUAGE_RUNTIMES)}; do command -v $p; done"
    )
    assert found.stdout == ""


def test_the_controller_image_is_smaller_than_the_runner(built_images: Images) -> None:
    assert built_images["controller"].unpacked_bytes < built_images["runner"].unpacked_bytes
