"""`blazar render kubernetes`: the same manifest as standard Kubernetes documents.

Past a handful of hosts Blazar runs on Kubernetes instead of growing its own
cluster manager; `documents` turns a loaded manifest (its host overlay merged,
when one was asked for) into:

- a ConfigMap holding the manifest's files as they are (an overlay too, under
  `hosts/`), mounted at /etc/blazar;
- a Secret reference: every remote's `key_env` comes from the Secret
  `NAME-keys`, which the operator creates (`kubectl create secret generic`),
  and any other variable in it (HF_TOKEN, ...) reaches serve too;
- a PersistentVolumeClaim for the model store (BLAZAR_HOME), sized from the
  models' and adapters' sizes (this host's store, else blazar.lock) plus room for
  engines and a fifth more, unless `[kubernetes].storage` says;
- a Deployment of `[kubernetes].replicas` pods running `blazar serve` (the
  image `packaging/Containerfile` builds), with a memory request from `blazar
  fit`'s estimate of the models that may be loaded at once (`nvidia.com/gpu: 1`
  when a model asks for GPU layers or an engine is built for CUDA), readiness
  and liveness probes on /health, and a pod that runs as a non-root user on a
  read-only root filesystem (the store and /tmp are its only writable places);
- a Service in front of it.

Pure but for reading the manifest's files and the store (`documents` takes
both); the CLI (`blazar.cli.fleet`) writes the YAML. docs/fleet.md says how this
relates to KubeAI and other operators.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar import __version__
from blazar.errors import InvalidInput
from blazar.host.hardware import Device
from blazar.models.fit import estimate
from blazar.reconcile.lockfile import lock_path, read_lock
from blazar.store.db import Store
from specs.loader import HOSTS, manifest_files, overlay_file
from specs.manifest import Manifest
from specs.names import parse_name

HOME = "/var/lib/blazar"  # BLAZAR_HOME in the pod: the store's volume
CONFIG = "/etc/blazar"  # the manifest's ConfigMap
PORT = 11435
UID = 10001  # the image's `blazar` user (packaging/Containerfile)
GIB = 1024**3
MIB = 1024**2
ENGINE_ROOM = 2 * GIB  # engines (a wheel's venv, a release, a build) and downloads
OVERHEAD = 512 * MIB  # serve itself, its children's runtime, the page cache it leans on
GPU_FLAGS = ("-ngl", "--n-gpu-layers", "--gpu-layers")
BIG = Device("cpu", 0, "render", 1 << 50, 1 << 50)  # fit's estimate, whatever fits here


@dataclass(frozen=True)
class Options:
    name: str = "blazar"
    image: str | None = None
    namespace: str | None = None
    host: str | None = None  # the overlay merged (`--host NAME`)


def documents(
    manifest: Manifest, path: Path, store: Store, options: Options = Options()
) -> list[dict[str, Any]]:
    """The Kubernetes documents for `manifest`, loaded from `path` (for its files)."""
    _refuse_what_a_pod_cannot_do(manifest)
    name = options.name
    settings = manifest.kubernetes
    labels = {
        "app.kubernetes.io/name": "blazar",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "blazar",
    }
    meta = {"name": name, "labels": labels}
    if options.namespace:
        meta["namespace"] = options.namespace
    sizes = model_sizes(manifest, path, store)
    storage = settings.storage or storage_bytes(manifest, sizes)
    memory = memory_bytes(manifest, sizes, store)
    gpu = wants_gpu(manifest)
    files = config_files(path, options.host)
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": f"{name}-manifest"},
        "data": {key: text for key, (_, text) in files.items()},
    }
    claim: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {**meta, "name": f"{name}-store"},
        "spec": {
            "accessModes": ["ReadWriteOnce" if settings.replicas == 1 else "ReadWriteMany"],
            "resources": {"requests": {"storage": quantity(storage)}},
        },
    }
    if settings.storage_class:
        claim["spec"]["storageClassName"] = settings.storage_class
    deployment = _deployment(manifest, options, meta, labels, files, memory, gpu)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [config, claim, deployment, service]


def _deployment(
    manifest: Manifest,
    options: Options,
    meta: dict[str, Any],
    labels: dict[str, str],
    files: Mapping[str, tuple[str, str]],
    memory: int,
    gpu: bool,
) -> dict[str, Any]:
    name = options.name
    args = ["serve", CONFIG, "--host", "0.0.0.0", "--port", str(PORT)]
    if options.host:
        args += ["--overlay", options.host]
    requests: dict[str, str] = {"cpu": manifest.kubernetes.cpu, "memory": quantity(memory)}
    limits: dict[str, str] = {"memory": quantity(memory)}
    if gpu:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = "1"
    env: list[dict[str, Any]] = [{"name": "BLAZAR_HOME", "value": HOME}]
    for key_env in sorted({r.key_env for r in manifest.remotes.values() if r.key_env}):
        ref = {"name": f"{name}-keys", "key": key_env}
        env.append({"name": key_env, "valueFrom": {"secretKeyRef": ref}})
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
    container = {
        "name": "blazar",
        "image": options.image or manifest.kubernetes.image or f"blazar:{__version__}",
        "args": args,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "envFrom": [{"secretRef": {"name": f"{name}-keys", "optional": True}}],
        "resources": {"requests": requests, "limits": limits},
        "readinessProbe": {**probe, "initialDelaySeconds": 2},
        # A first apply may download for long; /health answers meanwhile (serve listens
        # first), so liveness only catches a serve that stopped answering.
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "failureThreshold": 6},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "manifest", "mountPath": CONFIG, "readOnly": True},
            {"name": "store", "mountPath": HOME},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    items = [{"key": key, "path": where} for key, (where, _) in files.items()]
    volumes = [
        {"name": "manifest", "configMap": {"name": f"{name}-manifest", "items": items}},
        {"name": "store", "persistentVolumeClaim": {"claimName": f"{name}-store"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": manifest.kubernetes.replicas,
            "selector": {"matchLabels": labels},
            # One store: the old pod lets go of it before the new one starts.
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": UID,
                        "runAsGroup": UID,
                        "fsGroup": UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def _refuse_what_a_pod_cannot_do(manifest: Manifest) -> None:
    """A pod listens beyond loopback and reads no file of this machine: say so, once."""
    problems = []
    if not manifest.keys and not manifest.serving.allow_unauthenticated:
        problems.append(
            "the pod listens beyond loopback and the manifest declares no key: add one "
            "(`blazar keys add NAME`), or set serving.allow_unauthenticated = true"
        )
    for kind, table in (("models", manifest.models), ("loras", manifest.loras)):
        for name, resource in table.items():
            if resource.source.startswith("file://"):
                problems.append(
                    f"{kind}.{name}: {resource.source} is a file on this machine, which a pod "
                    "cannot read: use an hf://, https:// or pypi:// source"
                )
    if problems:
        raise InvalidInput("cannot render for Kubernetes:\n  " + "\n  ".join(problems))


def config_files(path: Path, host: str | None) -> dict[str, tuple[str, str]]:
    """ConfigMap key -> (path under /etc/blazar, text): the manifest's files as they are."""
    files = manifest_files(path) if path.is_dir() else [path]
    found = {f.name: (f.name, f.read_text(encoding="utf-8")) for f in files}
    overlay = overlay_file(path, host) if host else None
    if overlay is not None:
        where = f"{HOSTS}/{overlay.name}"
        found[f"{HOSTS}.{overlay.name}"] = (where, overlay.read_text(encoding="utf-8"))
    return found


def model_sizes(manifest: Manifest, path: Path, store: Store) -> dict[tuple[str, str], int]:
    """(kind, name) -> bytes of each model and adapter: this host's store, else the lock;
    an error naming those whose size neither knows (unless `[kubernetes].storage`)."""
    lock = read_lock(lock_path(path))
    sizes: dict[tuple[str, str], int] = {}
    missing = []
    held = {r.ref.short: r for r in store.list_models()}
    adapters = {lo.name: lo for lo in store.list_loras()}
    for kind, table in (("model", manifest.models), ("lora", manifest.loras)):
        for name, resource in table.items():
            key = parse_name(name).short if kind == "model" else name
            record = held.get(key) if kind == "model" else adapters.get(key)
            size: int | None = None
            if record is not None and record.source == resource.source:
                size = record.size
            elif lock is not None:
                entry = lock.find((kind, key, (("source", resource.source),)))
                found = entry.get("size") if entry is not None else None
                size = found if isinstance(found, int) else None
            if size is None:
                missing.append(f"{kind}s.{name}")
            else:
                sizes[(kind, key)] = size
    if missing and manifest.kubernetes.storage is None:
        raise InvalidInput(
            f"the size of {', '.join(missing)} is unknown here (neither this host's store nor "
            "blazar.lock has it): apply the manifest once and commit the blazar.lock it "
            "writes, or set [kubernetes].storage"
        )
    return sizes


def storage_bytes(manifest: Manifest, sizes: Mapping[tuple[str, str], int]) -> int:
    return int((sum(sizes.values()) + ENGINE_ROOM) * 1.2)


def memory_bytes(manifest: Manifest, sizes: Mapping[tuple[str, str], int], store: Store) -> int:
    """Memory for the models that may be loaded at once (`serving.max_loaded_models`, the
    largest first; warm replicas count each), by `blazar fit`'s estimate where the store
    has the GGUF's facts, else its size and a quarter more; plus serve's own."""
    held = {r.ref.short: r for r in store.list_models()}
    needs: list[int] = []
    for name, model in manifest.models.items():
        key = parse_name(name).short
        weights = sizes.get(("model", key), 0)
        record = held.get(key)
        slots = manifest.slots_for(name)
        if record is not None and record.source == model.source and record.facts.get("block_count"):
            report = estimate(
                key,
                {**record.facts, "size": record.size},
                [BIG],
                ctx=manifest.ctx_for(name) * slots,
                cache_type=model.cache_type or "f16",
                ctx_extend=model.ctx_extend,
            )
            need = report.needed
        else:
            need = int(weights * 1.25)
        needs += [need] * max(1, model.replicas)
    needs.sort(reverse=True)
    return OVERHEAD + sum(needs[: manifest.serving.max_loaded_models + _warm(manifest)])


def _warm(manifest: Manifest) -> int:
    return sum(max(0, m.replicas - 1) for m in manifest.models.values())


def wants_gpu(manifest: Manifest) -> bool:
    """A model asks for GPU layers (-ngl N > 0), or an engine lane is built for CUDA."""
    if any(e.backend == "cuda" for e in manifest.engines.values()):
        return True
    for model in manifest.models.values():
        args = list(model.args)
        for i, arg in enumerate(args):
            flag, _, value = arg.partition("=")
            if flag in GPU_FLAGS:
                value = value or (args[i + 1] if i + 1 < len(args) else "")
                if value.strip() not in ("", "0"):
                    return True
    return False


def quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity, rounded up to MiB (Gi when whole)."""
    mib = math.ceil(size / MIB)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def to_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False, default_flow_style=False)
