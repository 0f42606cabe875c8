"""`blazar render kubernetes`: the fleet example and a held model rendered, every document
validated strictly against a current Kubernetes schema (kubernetes-validate, offline)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.render.kubernetes import quantity, wants_gpu
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from specs.loader import load_manifest_text
from specs.names import parse_name
from tests.conftest import Blazar

ROOT = Path(__file__).resolve().parent.parent
K8S = all_versions()[-1]  # the newest schema the package ships
GIB = 1024**3


def test_the_validation_is_strict() -> None:
    """A field Kubernetes does not know fails it: the checks below can fail."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 1, "targetPort": "http"}], "portz": []},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, K8S, strict=True)


def validated(text: str) -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)  # raises on any problem
    return {d["kind"]: d for d in docs}


@pytest.fixture
def fleet_repo(tmp_path: Path) -> Path:
    """examples/fleet with the lock a first apply would have written (sizes)."""
    repo = tmp_path / "fleet"
    shutil.copytree(ROOT / "examples" / "fleet", repo)
    (repo / "blazar.lock").write_text(
        "version = 1\n\n"
        '[[model]]\nname = "qwen3-0.6b"\nsource = "qwen3-0.6b"\nsha256 = "' + "a" * 64 + '"\n'
        f"size = {3 * GIB}\n\n"
        '[[model]]\nname = "smollm2"\nsource = "hf://bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M"\n'
        f'sha256 = "{"b" * 64}"\nsize = {GIB}\n'
    )
    return repo


def test_the_fleet_example_renders_valid_kubernetes_documents(
    blazar: Blazar, fleet_repo: Path, tmp_path: Path
) -> None:
    out = blazar("render", "kubernetes", str(fleet_repo), "--host", "gpu-box").output
    docs = validated(out)
    assert sorted(docs) == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Service"]
    deployment = docs["Deployment"]["spec"]
    pod = deployment["template"]["spec"]
    [container] = pod["containers"]
    assert deployment["replicas"] == 1
    assert container["image"].startswith("blazar:")
    assert container["args"] == [
        "serve",
        "/etc/blazar",
        "--host",
        "0.0.0.0",
        "--port",
        "11435",
        "--overlay",
        "gpu-box",
    ]
    # resources: fit's estimate of both models (sizes from the lock, a quarter more) + serve
    resources = container["resources"]
    assert resources["requests"]["memory"] == quantity(int(4 * GIB * 1.25) + 512 * 1024**2)
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/blazar", "/tmp"}
    # the model store: the models' sizes, engines' room, a fifth more
    claim = docs["PersistentVolumeClaim"]["spec"]
    assert claim["resources"]["requests"]["storage"] == quantity(int((4 + 2) * GIB * 1.2))
    # the manifest as its files, the overlay under hosts/, mounted where serve reads it
    config = docs["ConfigMap"]["data"]
    assert set(config) == {"models.toml", "serving.toml", "hosts.gpu-box.toml"}
    [volume] = [v for v in pod["volumes"] if v["name"] == "manifest"]
    assert {"key": "hosts.gpu-box.toml", "path": "hosts/gpu-box.toml"} in volume["configMap"][
        "items"
    ]
    assert docs["Service"]["spec"]["ports"][0]["port"] == 11435
    assert docs["Service"]["spec"]["selector"] == deployment["selector"]["matchLabels"]
    # the rendered files load back as the same host's manifest
    back = tmp_path / "back"
    for item in volume["configMap"]["items"]:
        (back / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (back / item["path"]).write_text(config[item["key"]])
    from specs.loader import load_manifest

    assert load_manifest(back, "gpu-box") == load_manifest(fleet_repo, "gpu-box")

    # -o DIR: one file a document, each valid
    written = blazar(
        "render", "kubernetes", str(fleet_repo), "--host", "gpu-box", "-o", str(tmp_path / "k8s")
    ).output
    assert written.count("wrote") == 4
    for path in (tmp_path / "k8s").iterdir():
        validated(path.read_text())


def test_what_a_pod_cannot_do_is_refused_with_the_fix(
    blazar: Blazar, fleet_repo: Path, tmp_path: Path
) -> None:
    refused = blazar("render", "kubernetes", str(fleet_repo), ok=False)  # the base: no key
    assert refused.exit_code == 1
    assert "declares no key: add one (`blazar keys add NAME`)" in refused.output
    (fleet_repo / "blazar.lock").unlink()
    unsized = blazar("render", "kubernetes", str(fleet_repo), "--host", "gpu-box", ok=False)
    assert "the size of models.qwen3-0.6b, models.smollm2 is unknown here" in unsized.output
    assert "commit the blazar.lock it writes, or set [kubernetes].storage" in unsized.output
    local = tmp_path / "local.toml"
    local.write_text(
        '[serving]\nallow_unauthenticated = true\n[models.m]\nsource = "file:///m.gguf"\n'
    )
    refused = blazar("render", "kubernetes", str(local), ok=False)
    assert "models.m: file:///m.gguf is a file on this machine" in refused.output


def test_a_held_model_is_sized_by_fits_estimate_and_replicas_come_from_the_manifest(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    source = "hf://acme/tiny-GGUF:Q8_0"
    with Store(paths.db) as store:
        Registry(store, paths).import_file(tiny, parse_name("tiny"), source=source, managed=True)
    manifest = tmp_path / "k8s.toml"
    manifest.write_text(
        "[serving]\nallow_unauthenticated = true\n\n[kubernetes]\nreplicas = 3\n"
        'storage_class = "fast"\nimage = "registry.example/blazar:1"\n\n'
        f'[models.tiny]\nsource = "{source}"\nctx = 2048\nslots = 2\n\n'
        '[remotes.big]\nurl = "https://big:11435"\nkey_env = "BIG_KEY"\n'
    )
    docs = validated(blazar("render", "kubernetes", str(manifest), "--namespace", "llm").output)
    deployment = docs["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 3 and deployment["metadata"]["namespace"] == "llm"
    assert container["image"] == "registry.example/blazar:1"
    assert "nvidia.com/gpu" not in container["resources"]["requests"]
    fit = blazar("fit", "tiny", "--ctx", "4096", "--json").output
    import json

    needed = json.loads(fit)["needed"]
    assert container["resources"]["requests"]["memory"] == quantity(needed + 512 * 1024**2)
    claim = docs["PersistentVolumeClaim"]["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"] and claim["storageClassName"] == "fast"
    [key] = [e for e in container["env"] if e["name"] == "BIG_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "blazar-keys", "key": "BIG_KEY"}
    assert container["envFrom"] == [{"secretRef": {"name": "blazar-keys", "optional": True}}]


@pytest.mark.parametrize(
    ("args", "engine", "gpu"),
    [
        ([], "", False),
        (["-ngl", "99"], "", True),
        (["--n-gpu-layers=0"], "", False),
        (["--gpu-layers", "12"], "", True),
        ([], '[engines.llamacpp]\ninstall = "release"\nbackend = "cuda"\n', True),
    ],
)
def test_gpu_layers_ask_for_a_gpu(args: list[str], engine: str, gpu: bool) -> None:
    text = engine + f'[models.m]\nsource = "hf://a/b:Q4_K_M"\nargs = {args!r}\n'.replace("'", '"')
    assert wants_gpu(load_manifest_text(text)) is gpu
