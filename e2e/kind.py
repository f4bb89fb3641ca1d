"""The kind cluster and the images in it.

Invariants:
- A cluster is created from e2e/kind-config.yaml under the configured name, or reused as it is
  when asked to (TIDEMQ_E2E_REUSE=1); it is deleted only by :func:`delete`, which the session
  fixture calls unless told to keep or reuse it.
- The kubeconfig used by every kubectl/helm call is exported to a file of its own
  (``kind get kubeconfig``); kind also adds context ``kind-<name>`` to the user's kubeconfig, which
  is what a person debugging a kept cluster uses.
- Images go in as archives: ``docker save`` to a file, then ``kind load image-archive``. With
  Docker's containerd image store (Docker 29's default) ``kind load docker-image`` fails with
  "content digest ... not found" on images whose index names content the engine does not hold
  (buildx attestation manifests: the workflow builds with ``provenance: false`` too).
- An image counts as loaded only when every node's containerd lists it (``crictl images``),
  since kind may re-tag instead of loading when it already holds the same image ID.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from e2e.proc import CommandError, E2EError, run
from e2e.settings import KIND_CONFIG, ROOT

log = logging.getLogger(__name__)

CREATE_TIMEOUT = 600.0
DELETE_TIMEOUT = 300.0
LOAD_TIMEOUT = 600.0
BUILD_TIMEOUT = 1800.0
QUICK = 60.0


# -- cluster ---------------------------------------------------------------------------------------

def clusters() -> list[str]:
    return run(["kind", "get", "clusters"], timeout=QUICK).stdout.split()


def exists(name: str) -> bool:
    return name in clusters()


def create(name: str, node_image: str | None, artifacts: Path) -> None:
    args = ["kind", "create", "cluster", "--name", name, "--config", str(KIND_CONFIG), "--wait", "180s"]
    if node_image:
        args += ["--image", node_image]
    log.info("creating kind cluster %s", name)
    try:
        run(args, timeout=CREATE_TIMEOUT, log_file=artifacts / "kind-create.log")
    except CommandError:
        export_logs(name, artifacts / "kind-logs")
        raise


def delete(name: str) -> None:
    log.info("deleting kind cluster %s", name)
    run(["kind", "delete", "cluster", "--name", name], timeout=DELETE_TIMEOUT)


def export_logs(name: str, dest: Path) -> None:
    """``kind export logs`` (node journals, containerd, kubelet) for a failed run; best effort."""
    try:
        run(["kind", "export", "logs", str(dest), "--name", name], timeout=300)
    except E2EError as exc:
        log.warning("kind export logs failed: %s", str(exc).splitlines()[0])


def write_kubeconfig(name: str, path: Path) -> Path:
    text = run(["kind", "get", "kubeconfig", "--name", name], timeout=QUICK).stdout
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


def nodes(name: str) -> list[str]:
    return run(["kind", "get", "nodes", "--name", name], timeout=QUICK).stdout.split()


# -- images ----------------------------------------------------------------------------------------

def docker_build(tag: str, artifacts: Path, target: str | None = None) -> None:
    """``docker build -t TAG [--target T] .`` at the repository root (BuildKit; the Dockerfile
    needs it for ``ADD --chmod``), the whole output kept in the artifacts folder."""
    args = ["docker", "build", "-t", tag] + (["--target", target] if target else []) + ["."]
    log.info("building %s (docker build%s)", tag, f" --target {target}" if target else "")
    run(args, timeout=BUILD_TIMEOUT, cwd=ROOT, env={"DOCKER_BUILDKIT": "1", "BUILDKIT_PROGRESS": "plain"},
        log_file=artifacts / f"docker-build-{tag.replace(':', '_').replace('/', '_')}.log")


def docker_image_exists(image: str) -> bool:
    return run(["docker", "image", "inspect", image], timeout=QUICK, check=False).returncode == 0


def docker_tag(source: str, dest: str) -> None:
    if source != dest:
        run(["docker", "tag", source, dest], timeout=QUICK)


def load_image(cluster: str, image: str) -> None:
    """``docker save`` + ``kind load image-archive`` (see the module invariants), then check
    every node has the image under that name."""
    log.info("loading %s into kind cluster %s", image, cluster)
    # the archive (over 1 GB for the Spark image) lives only as long as the load
    with tempfile.TemporaryDirectory(prefix="tidemq-e2e-image-") as folder:
        archive = Path(folder) / "image.tar"
        run(["docker", "save", "--output", str(archive), image], timeout=LOAD_TIMEOUT)
        run(["kind", "load", "image-archive", str(archive), "--name", cluster], timeout=LOAD_TIMEOUT)
    missing = [n for n in nodes(cluster) if not node_has_image(n, image)]
    if missing:
        raise E2EError(f"`kind load image-archive` of {image} left the image missing on {', '.join(missing)}")


def normalized(image: str) -> str:
    """The name containerd stores a Docker Hub short name under (``tidemq:e2e`` ->
    ``docker.io/library/tidemq:e2e``)."""
    first, sep, _rest = image.partition("/")
    if not sep:
        return f"docker.io/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"docker.io/{image}"


def node_has_image(node: str, image: str) -> bool:
    """Whether the node's containerd lists ``image`` (``crictl images -o json`` repoTags)."""
    out = run(["docker", "exec", node, "crictl", "images", "-o", "json"], timeout=QUICK).stdout
    try:
        tags = {t for img in json.loads(out).get("images") or [] for t in img.get("repoTags") or []}
    except (ValueError, AttributeError):
        log.warning("cannot read `crictl images` on %s; assuming %s is there", node, image)
        return True
    return normalized(image) in tags or image in tags
