"""Start llama.cpp's HTTP server in-process through xllamacpp, with llama-server's flags.

The `wheel` install method of the `llamacpp` engine lane (see DESIGN.md, "Engines")
gives Blazar the `xllamacpp` package instead of a `llama-server` binary. Blazar
copies this file (as `launcher.py`, with `launcher_common.py` beside it) into each
such engine's own virtual environment, and its supervisor runs it with that
environment's Python exactly as it would run `llama-server`:

    python launcher.py --model m.gguf --host 127.0.0.1 --port 0 --parallel 2 ...

It accepts llama-server's spelling of the flags Blazar uses, maps them onto
`xllamacpp.CommonParams`, starts `xllamacpp.Server` (llama.cpp's native server, so
the HTTP API is llama-server's own) and serves until SIGTERM or SIGINT, then exits 0.
Once the server listens it prints llama-server's line and a machine-readable one:

    main: server is listening on http://127.0.0.1:PORT - starting the main loop
    blazar-launcher: listening on http://127.0.0.1:PORT

Bad input ends it with one `launcher: ...` line on stderr and no traceback: exit
code 2 for a command line it cannot run (an unknown flag, a flag without its value,
a bad value, no --model), 1 for a model, LoRA adapter or projector file that is missing
or that llama.cpp fails to load (the first error llama.cpp logged is quoted).

It runs under the engine's Python, not Blazar's: standard library and xllamacpp only.
The skeleton (parse, load, announce, serve until a signal; one-line errors, exit codes 2
and 1) is `launcher_common`'s, shared with the other lanes' launchers.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import xllamacpp  # type: ignore[import-untyped, import-not-found, unused-ignore]

if __package__:  # imported as blazar.engines.launchers.llama_launcher (Blazar's tests)
    from blazar.engines.launchers import launcher_common as common
else:  # run as a script in its engine's environment, launcher_common.py copied beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import launcher_common as common  # type: ignore[no-redef, import-not-found, unused-ignore]

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")
# --load-mode values as llama-server spells them, and their llama_load_mode names
LOAD_MODES = {
    "auto": "AUTO",
    "none": "NONE",
    "mmap": "MMAP",
    "mlock": "MLOCK",
    "mmap+mlock": "MMAP_MLOCK",
    "dio": "DIRECT_IO",
}
SPLIT_MODES = {"none": "NONE", "layer": "LAYER", "row": "ROW"}
FLASH_ATTN = {"on": "ENABLED", "off": "DISABLED", "auto": "AUTO"}
ROPE_SCALING = {"none": "NONE", "linear": "LINEAR", "yarn": "YARN"}


Apply = Callable[[Any, str], None]  # (xllamacpp.CommonParams, flag value) -> None


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # llama-server's spellings, long form first
    metavar: str | None  # None: a switch that takes no value
    help: str
    apply: Apply


# --- value converters: each raises UsageError with what it expected ---------------------


def _parse(kind: Callable[[str], Any], expected: str, value: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise common.UsageError(f"expected {expected}, got {value!r}") from None


def _int(value: str) -> int:
    return int(_parse(int, "an integer", value))


def _choice(value: str, choices: Collection[str]) -> str:
    if value.lower() not in choices:
        raise common.UsageError(f"expected one of {', '.join(choices)}, got {value!r}")
    return value.lower()


def _enum(enum: str, prefix: str, names: dict[str, str]) -> Callable[[str], Any]:
    """Convert a flag value (a key of `names`) into the xllamacpp enum member it names."""
    return lambda value: getattr(getattr(xllamacpp, enum), prefix + names[_choice(value, names)])


def _port(value: str) -> int:
    port = _int(value)
    if not 0 <= port <= 65535:
        raise common.UsageError(f"expected a port number from 0 to 65535, got {value!r}")
    return port


def _seed(value: str) -> int:
    return _int(value) % 2**32  # as llama-server reads it: -1 (random) is 0xFFFFFFFF


def _gpu_layers(value: str) -> int:
    return {"auto": -1, "all": -2}.get(value) or _int(value)


_cache_type = _enum("ggml_type", "GGML_TYPE_", {t: t.upper() for t in CACHE_TYPES})
_pooling = _enum("llama_pooling_type", "LLAMA_POOLING_TYPE_", {p: p.upper() for p in POOLING_TYPES})
_load_mode = _enum("llama_load_mode", "LLAMA_LOAD_MODE_", LOAD_MODES)
_split_mode = _enum("llama_split_mode", "LLAMA_SPLIT_MODE_", SPLIT_MODES)
TENSOR_SPLIT_LENGTH = 128  # xllamacpp's tensor_split is a fixed array of this many devices


def _tensor_split(params: Any, value: str) -> None:
    """--tensor-split 0,3,1: each GPU's share, by device index (zeros: GPUs not used)."""
    shares = [float(_parse(float, "comma-separated numbers", v)) for v in value.split(",")]
    if len(shares) > TENSOR_SPLIT_LENGTH or any(s < 0 for s in shares):
        raise common.UsageError(
            f"--tensor-split: expected at most {TENSOR_SPLIT_LENGTH} shares, none negative"
        )
    params.tensor_split = shares + [0.0] * (TENSOR_SPLIT_LENGTH - len(shares))


def _no_device_list(params: Any, value: str) -> NoReturn:
    """xllamacpp's CommonParams has no device list (llama-server's --device): refused, not
    ignored. Blazar places a wheel lane's model with --split-mode/--main-gpu and a
    --tensor-split by device index instead (docs/serve.md, devices)."""
    raise common.UsageError(
        f"--device {value}: the wheel engine (xllamacpp) has no device list; use "
        "--main-gpu N --split-mode none for one GPU, or --tensor-split with a share per "
        "device index (0 for a GPU not used), or the release or source install of llama.cpp"
    )


_flash_attn = _enum("llama_flash_attn_type", "LLAMA_FLASH_ATTN_TYPE_", FLASH_ATTN)
_rope_scaling = _enum("llama_rope_scaling_type", "LLAMA_ROPE_SCALING_TYPE_", ROPE_SCALING)


def _rope_scale(value: str) -> float:
    """--rope-scale N stretches the context N times: llama-server sets freq_scale = 1/N."""
    factor = float(_parse(float, "a number", value))
    if factor <= 0:
        raise common.UsageError(f"expected a positive factor, got {value!r}")
    return 1.0 / factor


def _directory(value: str) -> str:
    if not os.path.isdir(value):
        raise common.UsageError(f"not a directory: {value!r}")
    return value if value.endswith(os.sep) else value + os.sep


def _lora(item: str, scaled: bool) -> Any:
    path, sep, scale = item.rpartition(":") if scaled else (item, ":", "1")
    if not sep or not path:
        raise common.UsageError(f"expected FNAME:SCALE, got {item!r}")
    return xllamacpp.CommonAdapterLoraInfo(path, _parse(float, "a number", scale))


# --- appliers: how a flag's value lands on CommonParams ----------------------------------


def _set(attr: str, convert: Callable[[str], object] = str) -> Apply:
    """Set a (dotted) CommonParams attribute to the converted flag value; a build of
    xllamacpp without the attribute refuses the flag (never ignores it)."""

    def apply(params: Any, value: str) -> None:
        *parents, name = attr.split(".")
        try:
            for parent in parents:
                params = getattr(params, parent)
            if not hasattr(params, name):
                raise AttributeError(name)
        except AttributeError:
            raise common.UsageError(f"this engine (xllamacpp {_version()}) has no {attr}") from None
        converted = convert(value)
        try:
            setattr(params, name, converted)
        except (OverflowError, TypeError, ValueError):
            raise common.UsageError(f"out of range: {value!r}") from None

    return apply


def _version() -> str:
    return str(getattr(xllamacpp, "__version__", "unknown"))


def _spec_types() -> dict[str, Any]:
    """--spec-type values as llama-server spells them (draft-simple, ngram-map-k4v, ...),
    from this build's `common_speculative_type` members; {} for a build without it."""
    kinds = getattr(xllamacpp, "common_speculative_type", None)
    members = getattr(kinds, "__members__", {})
    named = {
        k.removeprefix("COMMON_SPECULATIVE_TYPE_").lower().replace("_", "-"): v
        for k, v in members.items()
        if not k.endswith("_COUNT")
    }
    return {**named, "draft": named["draft-simple"]} if "draft-simple" in named else named


def _set_spec_types(params: Any, value: str) -> None:
    known = _spec_types()
    if not known:
        raise common.UsageError(f"this engine (xllamacpp {_version()}) has no speculative decoding")
    params.speculative.types = [known[_choice(item, known)] for item in value.split(",")]


def _ngram(name: str) -> Apply:
    """An n-gram lookup knob, for each lookup that takes it (ngram-simple, -map-k, -map-k4v)."""
    kinds = ("ngram_simple", "ngram_map_k", "ngram_map_k4v")
    setters = [_set(f"speculative.{kind}.{name}", _int) for kind in kinds]

    def apply(params: Any, value: str) -> None:
        for setter in setters:
            setter(params, value)

    return apply


def _switch(attr: str, on: object = True) -> Apply:
    return _set(attr, lambda _value: on)


def _reranking(params: Any, value: str) -> None:
    """--reranking, as llama-server reads it: embeddings on, with rank pooling (the
    model's classification head scores a query and a document together)."""
    _switch("embedding")(params, value)
    _set("pooling_type", _pooling)(params, "rank")


def _extend(attr: str, convert: Callable[[str], object] = str) -> Apply:
    """Add the comma-separated items of the flag value to a list or set attribute."""

    def apply(params: Any, value: str) -> None:
        current = getattr(params, attr)
        items = [convert(item) for item in value.split(",") if item]
        setattr(params, attr, type(current)([*current, *items]))

    return apply


def _show_help(params: Any, value: str) -> NoReturn:
    print("usage: launcher.py --model FNAME [llama-server flags]\n")
    for flag in FLAGS:
        left = ", ".join(flag.names) + (f" {flag.metavar}" if flag.metavar else "")
        print(f"  {left:<44} {flag.help}")
    raise SystemExit(0)


def _set_host(params: Any, value: str) -> None:
    """xllamacpp 2026.10 takes a list of `hostnames`; 2026.9 and older one `hostname`."""
    if hasattr(params, "hostnames"):
        params.hostnames = [value]
    else:
        params.hostname = value


def _build_number(info: dict[str, Any]) -> int:
    """The wheel's BUILD_INFO says 0; its version's last part is llama.cpp's build number."""
    number = int(info.get("build_number") or 0)
    if number:
        return number
    parts = str(getattr(xllamacpp, "__version__", "")).split(".")
    return int(parts[2]) if len(parts) >= 3 and parts[2].isdigit() else 0


def _show_version(params: Any, value: str) -> NoReturn:
    info = getattr(xllamacpp, "BUILD_INFO", {})
    print(f"version: {_build_number(info)} ({info.get('commit', 'unknown')})")
    compiler, target = info.get("compiler", "unknown"), info.get("build_target", "unknown")
    print(f"built with {compiler} for {target}")
    print(f"built with xllamacpp {getattr(xllamacpp, '__version__', 'unknown')}")
    raise SystemExit(0)


_NO_MMAP, _MMAP = _load_mode("none"), _load_mode("mmap")

# (names, metavar or None for a switch, help, apply); names as llama-server spells them
_TABLE: list[tuple[str, str | None, str, Apply]] = [
    ("--model -m", "FNAME", "model path (GGUF)", _set("model.path")),
    (
        "--mmproj -mm",
        "FNAME",
        "multimodal projector (mmproj GGUF): images reach the model",
        _set("mmproj.path"),
    ),
    ("--host", "HOST", "address to listen on", _set_host),
    ("--port", "PORT", "port to listen on (default 8080); 0 picks a free one", _set("port", _port)),
    ("--reuse-port", None, "let several sockets share the port", _switch("reuse_port")),
    ("--ctx-size -c", "N", "context size, shared by the slots", _set("n_ctx", _int)),
    ("--parallel -np", "N", "number of slots", _set("n_parallel", _int)),
    ("--threads -t", "N", "generation threads", _set("cpuparams.n_threads", _int)),
    ("--threads-batch -tb", "N", "prompt threads", _set("cpuparams_batch.n_threads", _int)),
    (
        "--n-gpu-layers -ngl --gpu-layers",
        "N|auto|all",
        "layers to offload",
        _set("n_gpu_layers", _gpu_layers),
    ),
    (
        "--split-mode -sm",
        "|".join(SPLIT_MODES),
        "how to split across GPUs",
        _set("split_mode", _split_mode),
    ),
    ("--main-gpu -mg", "N", "the GPU of a model not split", _set("main_gpu", _int)),
    ("--tensor-split -ts", "N0,N1,...", "each GPU's share, by device index", _tensor_split),
    ("--device -dev", "DEV", "refused: no device list in xllamacpp", _no_device_list),
    ("--batch-size -b", "N", "logical batch size", _set("n_batch", _int)),
    ("--ubatch-size -ub", "N", "physical batch size", _set("n_ubatch", _int)),
    ("--n-predict -n", "N", "default token limit of a request", _set("n_predict", _int)),
    ("--seed -s", "SEED", "default sampling seed", _set("sampling.seed", _seed)),
    ("--alias -a", "NAME", "model name(s) in the API, comma-separated", _extend("model_alias")),
    ("--api-key", "KEY", "required API key(s), comma-separated", _extend("api_keys")),
    ("--jinja", None, "use the Jinja chat template engine (default)", _switch("use_jinja")),
    ("--no-jinja", None, "do not use Jinja", _switch("use_jinja", False)),
    ("--chat-template", "TEMPLATE", "chat template name or text", _set("chat_template")),
    ("--metrics", None, "serve /metrics", _switch("endpoint_metrics")),
    ("--slots", None, "serve /slots (default)", _switch("endpoint_slots")),
    ("--no-slots", None, "do not serve /slots", _switch("endpoint_slots", False)),
    ("--props", None, "allow POST /props", _switch("endpoint_props")),
    ("--slot-save-path", "DIR", "where slots are saved", _set("slot_save_path", _directory)),
    (
        "--lora",
        "FNAME",
        "LoRA adapter(s), comma-separated",
        _extend("lora_adapters", lambda v: _lora(v, scaled=False)),
    ),
    (
        "--lora-scaled",
        "FNAME:SCALE",
        "LoRA adapter(s), comma-separated",
        _extend("lora_adapters", lambda v: _lora(v, scaled=True)),
    ),
    (
        "--lora-init-without-apply",
        None,
        "load adapters at scale 0",
        _switch("lora_init_without_apply"),
    ),
    ("--embeddings --embedding", None, "serve embeddings only", _switch("embedding")),
    ("--pooling", "|".join(POOLING_TYPES), "embedding pooling", _set("pooling_type", _pooling)),
    ("--reranking --rerank", None, "serve /v1/rerank: embeddings, rank pooling", _reranking),
    ("--cache-type-k -ctk", "TYPE", "K cache type", _set("cache_type_k", _cache_type)),
    ("--cache-type-v -ctv", "TYPE", "V cache type", _set("cache_type_v", _cache_type)),
    ("--kv-unified -kvu", None, "one KV buffer for all slots", _switch("kv_unified")),
    ("--no-kv-unified -no-kvu", None, "a KV buffer per slot", _switch("kv_unified", False)),
    ("--cache-reuse", "N", "min chunk to reuse by KV shifting", _set("n_cache_reuse", _int)),
    (
        "--slot-prompt-similarity -sps",
        "F",
        "how much of a prompt a slot's cache must share for the prompt to take that slot",
        _set("slot_prompt_similarity", lambda v: float(_parse(float, "a number", v))),
    ),
    (
        "--spec-type",
        "TYPE[,TYPE]",
        "speculative decoding: none, draft, ngram-simple, ...",
        _set_spec_types,
    ),
    (
        "--spec-draft-model --model-draft -md",
        "FNAME",
        "draft model (--spec-type draft)",
        _set("speculative.draft.mparams.path"),
    ),
    (
        "--spec-draft-n-max --draft-max --draft-n --draft",
        "N",
        "most tokens drafted a step",
        _set("speculative.draft.n_max", _int),
    ),
    (
        "--spec-draft-n-min --draft-min",
        "N",
        "fewest tokens drafted a step",
        _set("speculative.draft.n_min", _int),
    ),
    (
        "--spec-draft-p-min --draft-p-min",
        "P",
        "least draft probability to go on",
        _set("speculative.draft.p_min", lambda v: float(_parse(float, "a number", v))),
    ),
    (
        "--spec-draft-threads --threads-draft -td",
        "N",
        "draft generation threads",
        _set("speculative.draft.cpuparams.n_threads", _int),
    ),
    (
        "--spec-draft-threads-batch --threads-batch-draft -tbd",
        "N",
        "draft prompt threads",
        _set("speculative.draft.cpuparams_batch.n_threads", _int),
    ),
    ("--spec-ngram-size-n", "N", "n-gram lookup: tokens it matches", _ngram("size_n")),
    ("--spec-ngram-size-m", "N", "n-gram lookup: tokens it drafts", _ngram("size_m")),
    ("--spec-ngram-min-hits", "N", "n-gram lookup: hits before it drafts", _ngram("min_hits")),
    (
        "--lookup-cache-static -lcs",
        "FNAME",
        "ngram-cache: a static lookup cache",
        _set("speculative.ngram_cache.lookup_cache_static"),
    ),
    (
        "--lookup-cache-dynamic -lcd",
        "FNAME",
        "ngram-cache: a dynamic lookup cache",
        _set("speculative.ngram_cache.lookup_cache_dynamic"),
    ),
    (
        "--cache-ram -cram",
        "MiB",
        "host-memory prompt cache (0: off, -1: no limit)",
        _set("cache_ram_mib", _int),
    ),
    ("--flash-attn -fa", "on|off|auto", "flash attention", _set("flash_attn_type", _flash_attn)),
    (
        "--rope-scaling",
        "none|linear|yarn",
        "RoPE frequency scaling",
        _set("rope_scaling_type", _rope_scaling),
    ),
    ("--rope-scale", "N", "extend the context N times", _set("rope_freq_scale", _rope_scale)),
    ("--yarn-orig-ctx", "N", "YaRN: the training context", _set("yarn_orig_ctx", _int)),
    ("--load-mode -lm", "|".join(LOAD_MODES), "how to load", _set("load_mode", _load_mode)),
    ("--mmap", None, "same as --load-mode mmap", _switch("load_mode", _MMAP)),
    ("--no-mmap", None, "same as --load-mode none", _switch("load_mode", _NO_MMAP)),
    ("--no-warmup", None, "skip the warm-up run", _switch("warmup", False)),
    ("--verbose -v", None, "log everything", _switch("verbosity", 2**31 - 1)),
    ("--verbosity -lv", "N", "log verbosity threshold", _set("verbosity", _int)),
    ("--version", None, "print the version and exit", _show_version),
    ("--help -h", None, "print this help and exit", _show_help),
]
FLAGS = tuple(
    Flag(tuple(names.split()), metavar, help, apply) for names, metavar, help, apply in _TABLE
)
FLAG_BY_NAME = {name: flag for flag in FLAGS for name in flag.names}


# --- command line ------------------------------------------------------------------------


def _unknown_flag(name: str) -> common.UsageError:
    close = difflib.get_close_matches(name, FLAG_BY_NAME, n=1, cutoff=0.75)
    if close:
        return common.UsageError(f"unknown flag {name!r}; did you mean {close[0]!r}? (see --help)")
    known = ", ".join(flag.names[0] for flag in FLAGS)
    return common.UsageError(
        f"unknown flag {name!r}; llama-server flags this launcher accepts: {known}"
    )


def parse_args(argv: Sequence[str]) -> Any:
    """Turn llama-server style arguments into an `xllamacpp.CommonParams`.

    Values follow their flag (`--port 8080`) or are attached with `=` (`--port=8080`);
    a value may start with `-` (`--seed -1`) but may not be another flag.
    """
    params = xllamacpp.CommonParams()
    _set_host(params, "127.0.0.1")
    params.port = 8080  # llama-server's default
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("-") or arg == "-":
            raise common.UsageError(
                f"unexpected argument {arg!r} (flags only; the model goes in --model)"
            )
        name, attached, value = arg.partition("=")
        flag = FLAG_BY_NAME.get(name)
        if flag is None:
            raise _unknown_flag(name)
        if flag.metavar is None and attached:
            raise common.UsageError(f"flag {name} takes no value")
        if flag.metavar is not None and not attached:
            if not args or args[0] in FLAG_BY_NAME or args[0].startswith("--"):
                raise common.UsageError(f"flag {name} needs a value ({flag.metavar})")
            value = args.pop(0)
        try:
            flag.apply(params, value)
        except common.UsageError as err:
            raise common.UsageError(f"bad value for {name}: {err}") from None
    model = params.model.path
    if not model:
        raise common.UsageError("no model given; pass --model FNAME (a GGUF file)")
    if hasattr(getattr(params, "speculative", None), "types"):
        _speculative_defaults(params)
    return params


def _speculative_defaults(params: Any) -> None:
    """As llama-server: a draft model alone means --spec-type draft; a draft type needs
    a draft model; the draft runs on the main threads unless told otherwise."""
    spec, known = params.speculative, _spec_types()
    drafting = [t for t in spec.types if str(t.name).startswith("COMMON_SPECULATIVE_TYPE_DRAFT")]
    if spec.draft.mparams.path and all(t == known.get("none") for t in spec.types):
        spec.types, drafting = [known["draft-simple"]], [known["draft-simple"]]
    if drafting and not spec.draft.mparams.path:
        raise common.UsageError(
            "--spec-type draft needs a draft model: pass --spec-draft-model FNAME"
        )
    draft = spec.draft
    if draft.cpuparams.n_threads <= 0:
        draft.cpuparams.n_threads = params.cpuparams.n_threads
    if draft.cpuparams_batch.n_threads <= 0:
        batch = params.cpuparams_batch.n_threads
        draft.cpuparams_batch.n_threads = batch if batch > 0 else draft.cpuparams.n_threads


def check_files(params: Any) -> None:
    """The files the flags name, each present, before llama.cpp is asked to load them."""
    files = [("model", params.model.path)]
    files += [("LoRA adapter", adapter.path) for adapter in params.lora_adapters]
    if (
        hasattr(getattr(params, "speculative", None), "types")
        and params.speculative.draft.mparams.path
    ):
        files.append(("draft model", params.speculative.draft.mparams.path))
    if params.mmproj.path:
        files.append(("projector", params.mmproj.path))
    for what, path in files:
        if not os.path.isfile(path):
            problem = "is not a file" if os.path.exists(path) else "not found"
            raise common.LoadError(f"{what} {problem}: {path}")


# --- loading and serving -----------------------------------------------------------------

_LOG_ERROR = re.compile(r"^\S*\s*E\s+(?:(?:srv|cmn|ctx|res|que|slt)\s+)?(.*\S)\s*$")


def _first_error(log: bytes) -> str | None:
    """The first error-level line of llama.cpp's log: the most specific reason it gives."""
    for line in log.decode("utf-8", "replace").splitlines():
        match = _LOG_ERROR.match(line)
        if match:
            return "".join(c if c.isprintable() else "?" for c in match.group(1))
    return None


def start_server(params: Any) -> Any:
    """Construct `xllamacpp.Server`, which loads the model and starts listening.

    llama.cpp logs to file descriptor 2 while it loads. That log is captured so that
    a failure can be reported in one line naming the first error llama.cpp logged;
    on success (or with a verbosity above 3) the captured log is passed on to stderr.
    """
    check_files(params)
    # llama.cpp's server listens (and its own /health answers, and its log says "listening
    # on") as soon as `xllamacpp.Server` returns, before this launcher announces itself: a
    # supervisor may find it ready and stop it in that window, so a signal exits 0 from here
    # on (it was the default action: exit code -15)
    common.exit_on_signal()
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            server = xllamacpp.Server(params)
        except Exception as exc:
            reason = None
            for _ in range(50):  # llama.cpp may log from another thread: give it a moment
                log.seek(0)
                reason = _first_error(log.read())
                if reason:
                    break
                time.sleep(0.01)
            server, failure = None, f"failed to load model {params.model.path}: {reason or exc}"
        finally:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
        if server is not None or params.verbosity > 3:
            log.seek(0)
            sys.stderr.buffer.write(log.read())
            sys.stderr.flush()
    if server is None:
        raise common.LoadError(failure)
    return server


def serve_forever(server: Any) -> NoReturn:
    """Announce the address (llama-server's line, then Blazar's), then block until
    SIGTERM or SIGINT ends the process with exit code 0."""
    # The server's threads may take the signal; the wakeup fd wakes this thread anyway,
    # and Python then runs the handler here.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    common.exit_on_signal()  # xllamacpp.Server has no stop; its destructor would wait on its loop
    address = str(server.listening_address)
    if "://" not in address:
        address = "http://" + address
    print(f"main: server is listening on {address} - starting the main loop")
    common.announce("blazar-launcher", address)
    while True:
        os.read(wake_read, 64)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return common.run("launcher", lambda: parse_args(args), start_server, serve_forever)


if __name__ == "__main__":
    sys.exit(main())
