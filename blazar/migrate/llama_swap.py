"""`blazar migrate llama-swap config.yaml`: llama-swap's models, as far as they map.

Read: macros (global and per model, `${env.VAR}` from the environment, `${MODEL_ID}`),
each model's `cmd` when it runs llama-server (its flags mapped by
`blazar.migrate.server_flags`: the GGUF, ctx, slots, sampling, cache and loading flags
become fields, other llama-server flags `args`, `--lora` always-on adapters), `ttl`
(`keep_alive`; 0 is never), `aliases`, `globalTTL`, `hooks.on_startup.preload`
(`replicas = 1`), `apiKeys` (`[keys]`, their sha256 only), `peers` (`[remotes]`) and
`groups`: a swap group becomes `[groups.NAME]` with `exclusive = true` (`_groups`), a
persistent group's models are pinned, and since llama-swap runs one model at a time
unless groups say otherwise, `serving.max_loaded_models` becomes the most models its
groups would hold at once. Everything else (per-model env, cmdStop, filters, the
matrix solver, a cmd that runs another server, ...) is listed with why
(`blazar.migrate.Unmapped`). Pure apart from reading the one file.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from blazar.errors import InvalidInput
from blazar.migrate import Migrated, clean_name, unique
from blazar.migrate.server_flags import map_command

_MACRO = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")
_ENV_ONLY = re.compile(r"\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}")
_SERVER = re.compile(r"(^|/)llama-server(\.exe)?$")
GLOBAL_WHY = {
    "healthCheckTimeout": "Blazar waits for a child's /health on its own deadline",
    "logLevel": "Blazar's logs are under its state directory (`blazar doctor`)",
    "logTimeFormat": "as logLevel",
    "logToStdout": "as logLevel",
    "metricsMaxInMemory": "Blazar keeps traces in its store (serving.trace_retention)",
    "captureBuffer": "as metricsMaxInMemory",
    "startPort": "Blazar picks each child's port",
    "sendLoadingState": "Blazar does not stream loading progress into replies",
    "includeAliasesInList": "Blazar lists a model's aliases in /api/tags",
}
MODEL_WHY = {
    "env": "Blazar sets no per-model environment: set it for `blazar serve` itself",
    "cmdStop": "Blazar stops its own children (SIGTERM, then SIGKILL)",
    "proxy": "Blazar routes to the children it starts",
    "checkEndpoint": "Blazar checks its children's /health",
    "unlisted": "Blazar lists every model it serves (a key's models limit what it sees)",
    "useModelName": "Blazar sends the model it serves by its own name",
    "filters": "Blazar does not rewrite requests; sampling defaults are `params`",
    "name": "a display name: Blazar names a model by its key",
    "description": "as name",
    "metadata": "Blazar's /v1/models shows no metadata",
    "concurrencyLimit": "use slots (parallel sequences) and serving's queue limits",
    "sendLoadingState": GLOBAL_WHY["sendLoadingState"],
    "timeouts": "Blazar's proxy timeouts are its own",
}
MAPPED_MODEL_KEYS = {"cmd", "ttl", "aliases", "macros"}


def _load(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise InvalidInput(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise InvalidInput(f"{path} is not a llama-swap config: it has no `models:` mapping")
    return data


class _Macros:
    """llama-swap's substitutions: `${env.VAR}` first, then macros (a model's over the
    global ones, in order), then `${MODEL_ID}`; `${PORT}` is left for the flag mapping."""

    def __init__(self, env: Mapping[str, str], out: Migrated) -> None:
        self.env = env
        self.out = out

    def expand(self, text: str, macros: dict[str, Any], model_id: str, where: str) -> str:
        def env(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in self.env:
                self.out.skip(
                    where, match.group(0), f"${name} is not set here: set it and migrate again"
                )
                return match.group(0)
            return self.env[name]

        text = _ENV_ONLY.sub(env, text)
        for _ in range(10):  # macros may use macros defined before them
            new = _MACRO.sub(lambda m: self._one(m, macros, model_id), text)
            if new == text:
                break
            text = new
        return text

    @staticmethod
    def _one(match: re.Match[str], macros: dict[str, Any], model_id: str) -> str:
        name = match.group(1)
        if name == "MODEL_ID":
            return model_id
        if name in macros:
            value = macros[name]
            return str(value).lower() if isinstance(value, bool) else str(value)
        return match.group(0)


def _words(cmd: str) -> list[str]:
    """`cmd` as llama-swap reads it: comment lines dropped, then split like a shell."""
    lines = [ln for ln in cmd.splitlines() if not ln.strip().startswith("#")]
    return shlex.split(" ".join(lines))


def migrate_config(path: Path, env: Mapping[str, str]) -> Migrated:
    """Declarations for a llama-swap config (see the module's docstring)."""
    path = path.expanduser().resolve()
    data = _load(path)
    out = Migrated(origin=f"the llama-swap config {path}")
    macros = _Macros(env, out)
    found = data.get("macros")
    global_macros: dict[str, Any] = found if isinstance(found, dict) else {}
    names: dict[str, str] = {}  # llama-swap model id -> Blazar name
    taken: set[str] = set()
    for model_id, spec in data["models"].items():
        if not isinstance(spec, dict):
            out.skip(f"models.{model_id}", spec, "not a mapping")
            continue
        declared = _model(out, macros, str(model_id), spec, global_macros, path.parent, taken)
        if declared is not None:
            names[str(model_id)] = declared
    _globals(out, data, names, macros, global_macros)
    return out


def _model(
    out: Migrated,
    macros: _Macros,
    model_id: str,
    spec: dict[str, Any],
    global_macros: dict[str, Any],
    base: Path,
    taken: set[str],
) -> str | None:
    where = f"models.{model_id}"
    found = spec.get("macros")
    own: dict[str, Any] = found if isinstance(found, dict) else {}
    scope = {**global_macros, **own}
    cmd = macros.expand(str(spec.get("cmd") or ""), scope, model_id, f"{where}.cmd")
    try:
        words = _words(cmd)
    except ValueError as exc:
        out.skip(f"{where}.cmd", cmd, f"cannot be split into words ({exc})")
        return None
    if not words:
        out.skip(where, "no cmd", "a model needs a cmd that runs llama-server")
        return None
    if not _SERVER.search(words[0]):
        out.skip(
            f"{where}.cmd",
            cmd,
            f"it runs {Path(words[0]).name}, not llama-server: Blazar serves GGUF models "
            "with its own llama.cpp engines (declare the model by hand if it is a GGUF)",
        )
        return None
    mapped = map_command(words[1:], base)
    for flag, value, why in mapped.unmapped:
        out.skip(f"{where}.cmd {flag}", value, why)
    if "source" not in mapped.fields:
        out.skip(where, cmd, "its cmd names no model (-m/--model or -hf): nothing to declare")
        return None
    name = unique(clean_name(model_id), taken)
    if name != model_id:
        out.skip(
            f"{where} (name)",
            model_id,
            f"declared as {name!r}: Blazar's names are lowercase "
            "letters, digits, '.', '-', '_' and one ':tag'",
        )
    fields = {"source": mapped.fields.pop("source"), **mapped.fields}
    aliases = [a for a in fields.pop("aliases", []) if clean_name(a) != name]
    for alias in spec.get("aliases") or []:
        alias_id = alias.get("id") if isinstance(alias, dict) else alias
        if isinstance(alias_id, str) and alias_id:
            aliases.append(alias_id)
    cleaned = []
    for alias in aliases:
        short = clean_name(alias)
        if short != alias:
            out.skip(f"{where}.aliases", alias, f"declared as {short!r} (Blazar's name rules)")
        if short != name and short not in cleaned:
            cleaned.append(short)
    if cleaned:
        fields["aliases"] = cleaned
    ttl = spec.get("ttl")
    if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0:
        fields["keep_alive"] = f"{ttl}s" if ttl > 0 else -1
    elif ttl is not None and ttl != -1:
        out.skip(f"{where}.ttl", ttl, "ttl is whole seconds (0: never unload)")
    if mapped.args:
        fields["args"] = mapped.args
    for key, value in spec.items():
        if key not in MAPPED_MODEL_KEYS:
            out.skip(f"{where}.{key}", value, MODEL_WHY.get(key, "a setting Blazar does not know"))
    out.declare("models", name, fields)
    for n, lora in enumerate(mapped.loras, start=1):
        lora_name = unique(clean_name(f"{name.replace(':', '-')}-lora-{n}"), taken)
        out.declare("loras", lora_name, {"model": name, **lora, "always_on": True})
    return name


def _globals(
    out: Migrated,
    data: dict[str, Any],
    names: dict[str, str],
    macros: _Macros,
    global_macros: dict[str, Any],
) -> None:
    ttl = data.get("globalTTL")
    if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0:
        out.serving["keep_alive"] = f"{ttl}s"
    else:
        out.serving["keep_alive"] = -1
        out.notes.append("serving.keep_alive = -1: llama-swap unloads a model only for its ttl.")
    _groups(out, data, names)
    preload = ((data.get("hooks") or {}).get("on_startup") or {}).get("preload") or []
    for model_id in preload:
        if str(model_id) in names and (group := swapping(out, names[str(model_id)])):
            out.skip(
                "hooks.on_startup.preload",
                model_id,
                f"it swaps with the others of groups.{group}: a model kept warm "
                "(replicas = 1) cannot be in an exclusive group; it loads on first use",
            )
        elif str(model_id) in names:
            out.resources["models"][names[str(model_id)]]["replicas"] = 1
        else:
            out.skip("hooks.on_startup.preload", model_id, "a model that was not migrated")
    for n, key in enumerate(data.get("apiKeys") or [], start=1):
        text = macros.expand(str(key), global_macros, "", f"apiKeys[{n}]")
        if _MACRO.search(text):
            continue  # an unset ${env.VAR}: listed by expand
        digest = hashlib.sha256(text.encode()).hexdigest()
        out.declare(
            "keys",
            f"llama-swap-{n}",
            {
                "sha256": digest,
                "description": "migrated from llama-swap's apiKeys (only its sha256 is here)",
            },
        )
    for peer_id, peer in (data.get("peers") or {}).items():
        _peer(out, str(peer_id), peer)
    for key, value in data.items():
        if key in GLOBAL_WHY:
            out.skip(key, value, GLOBAL_WHY[key])
        elif key not in (
            "models",
            "macros",
            "globalTTL",
            "groups",
            "matrix",
            "hooks",
            "apiKeys",
            "peers",
        ):
            out.skip(key, value, "a setting Blazar does not know")


def _peer(out: Migrated, peer_id: str, peer: Any) -> None:
    where = f"peers.{peer_id}"
    if not isinstance(peer, dict) or not isinstance(peer.get("proxy"), str):
        out.skip(where, peer, "a peer needs a proxy URL")
        return
    fields: dict[str, Any] = {"url": peer["proxy"]}
    models = [clean_name(str(m)) for m in peer.get("models") or []]
    if models:
        fields["models"] = models
    key = peer.get("apiKey")
    if isinstance(key, str) and (match := _ENV_ONLY.fullmatch(key.strip())):
        fields["key_env"] = match.group(1)
    elif key:
        out.skip(
            f"{where}.apiKey",
            "(a key)",
            "Blazar reads a remote's key from an environment "
            "variable: put it in one and set key_env",
        )
    for extra in sorted(set(peer) - {"proxy", "models", "apiKey"}):
        out.skip(f"{where}.{extra}", peer[extra], "Blazar's remotes have no such setting")
    out.declare("remotes", clean_name(peer_id).replace(":", "-"), fields)


def _groups(out: Migrated, data: dict[str, Any], names: dict[str, str]) -> None:
    """llama-swap's groups: a `swap` group of two models or more (one at a time, the
    default) becomes `[groups.NAME]` with `exclusive = true`; a persistent group's models
    are pinned (when it also swaps, the group is declared and they are not: a pinned
    model cannot be in an exclusive group); `swap: false` needs no group (Blazar's models
    run together while memory allows). Across groups, llama-swap's `exclusive` (loading
    one group unloads the others) has no equivalent: `serving.max_loaded_models` is set
    to the most models its groups would hold at once."""
    groups = data.get("groups") or {}
    if data.get("matrix"):
        out.skip(
            "matrix",
            data["matrix"],
            "Blazar has no swap solver: it keeps what fits serving.memory_budget (at most "
            "serving.max_loaded_models) and evicts the cheapest idle models; declare "
            "[groups.NAME] for models that must swap",
        )
    if not isinstance(groups, dict) or not groups:
        if not data.get("matrix"):
            out.serving["max_loaded_models"] = 1
            out.notes.append("serving.max_loaded_models = 1: llama-swap runs one model at a time.")
        return
    grouped: set[str] = set()
    taken: set[str] = set()
    persistent = exclusive = together = 0
    for group_id, group in groups.items():
        where = f"groups.{group_id}"
        if not isinstance(group, dict):
            out.skip(where, group, "not a mapping")
            continue
        members = [str(m) for m in group.get("members") or []]
        grouped.update(members)
        for member in members:
            if member not in names:
                out.skip(f"{where}.members", member, "a model that was not migrated")
        declared = [names[m] for m in members if m in names]
        swaps = bool(group.get("swap", True))
        holds = 1 if swaps else max(len(members), 1)
        if group.get("persistent", False):
            persistent += holds
        elif group.get("exclusive", True):
            exclusive = max(exclusive, holds)
        else:
            together += holds
        for extra in sorted(set(group) - {"members", "swap", "exclusive", "persistent"}):
            out.skip(f"{where}.{extra}", group[extra], "Blazar's groups have no such setting")
        if swaps and len(declared) > 1:
            name = unique(clean_name(str(group_id)).replace(":", "-"), taken)
            out.declare(
                "groups",
                name,
                {
                    "models": declared,
                    "exclusive": True,
                    "description": f"llama-swap's group {group_id} (swap: one at a time)",
                },
            )
            if group.get("persistent", False):
                out.notes.append(
                    f"groups.{name}: llama-swap's group {group_id} is persistent, but a "
                    "pinned model cannot be in an exclusive group: its models are not pinned."
                )
        elif group.get("persistent", False):
            for member in declared:
                out.resources["models"][member]["pin"] = True
    if set(names) - grouped:  # llama-swap's default group: one at a time, exclusive
        exclusive = max(exclusive, 1)
    most = persistent + max(exclusive, together)
    out.serving["max_loaded_models"] = max(most, 1)
    out.notes.append(
        f"serving.max_loaded_models = {max(most, 1)}: the most models llama-swap's groups "
        "hold loaded at once (a group's exclusive, unloading the other groups, has no "
        "Blazar equivalent: this cap stands in for it)."
    )


def swapping(out: Migrated, model: str) -> str | None:
    """The exclusive group a migrated model is in, if any."""
    for name, fields in out.resources.get("groups", {}).items():
        if model in fields["models"]:
            return name
    return None
