"""`[serving]`: how the gateway listens and how loaded models are scheduled; part of
the manifest (`specs.manifest.Manifest`)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, model_validator

from specs.durations import Duration
from specs.fields import HttpUrl, NonEmpty
from specs.problems import FieldError
from specs.sizes import Size, SizeOrShare
from specs.tables import CacheType, FlashAttn, LoadMode, Table


class TraceRetention(Table):
    """How many request traces the store keeps, and for how long (`blazar why`)."""

    age: Duration = Field(
        default="168h",
        validate_default=True,
        description="Traces older than this are deleted (-1: any age is kept).",
    )
    count: int = Field(
        default=100_000, ge=1, description="At most this many traces are kept, the newest."
    )


CacheTier = Literal["exact", "semantic"]


class ResponseCache(Table):
    """The response cache (docs/cache.md): answers replayed without calling a model."""

    enabled: bool = Field(
        default=False,
        description="Answer a reproducible request (temperature 0, or a seed on a "
        "deterministic model) from an earlier identical one's answer; off by default.",
    )
    tiers: list[CacheTier] = Field(
        default_factory=lambda: list[CacheTier](["exact", "semantic"]),
        description="The tiers used when enabled: exact (the same model, settings and "
        "request) and semantic (the same conversation but for a last user message whose "
        "embedding is within `threshold`; needs `model`).",
    )
    scope: Literal["key", "global"] = Field(
        default="key",
        description="key: an API key's entries answer only that key's requests; global: "
        "any key's (only for callers who share everything anyway).",
    )
    threshold: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="The cosine similarity a semantic hit needs between the last user "
        "messages' embeddings.",
    )
    ttl: Duration = Field(
        default="24h",
        validate_default=True,
        description="Entries older than this are not answered from, and are deleted "
        "(-1: no age limit).",
    )
    max_bytes: Size = Field(
        default="256MiB",
        validate_default=True,
        description="The store's cache entries are kept under this size, the least "
        "recently used deleted first.",
    )
    model: NonEmpty | None = Field(
        default=None,
        description="The embeddings model of the semantic tier, a model declared in this "
        "manifest (loaded and evicted like any model). None: exact tier only.",
    )


class Serving(Table):
    """How the gateway listens and how loaded models are scheduled."""

    host: NonEmpty = Field(default="127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(default=11435, ge=1, le=65535, description="TCP port the gateway listens on.")
    max_loaded_models: int = Field(
        default=3,
        ge=1,
        description="Most models loaded at once, a cap on top of serving.memory_budget: "
        "loading one more evicts idle models (docs/serve.md, the scheduler).",
    )
    memory_budget: SizeOrShare | None = Field(
        default=None,
        description="Memory models may use on each device (every GPU, else host RAM): a "
        "size ('12GiB') or a share of the device's total ('80%'). Loading a model that does "
        "not fit evicts the idle models that free enough at the least cost. Default: the "
        "device's free memory when serve starts, less a margin of 10% of its total (at "
        "most 2 GiB).",
    )
    min_residency: Duration = Field(
        default="5s",
        validate_default=True,
        description="A model loaded on demand stays at least this long before another "
        "load may evict it, so that clients alternating between models do not thrash them.",
    )
    fairness_window: Duration = Field(
        default="10s",
        validate_default=True,
        description="While a load waits for room that busy models hold, their new requests "
        "keep taking slots only this long; then they wait their turn (requests in flight "
        "and queued finish), the waiting model loads, and they follow once it is idle. "
        "x-blazar-priority: high is never held. 0: no bound (the resident model keeps its "
        "place as long as its requests keep coming).",
    )
    fork_server: bool = Field(
        default=True,
        description="Start a wheel engine's model children by forking a process that has "
        "already imported the engine (one per engine in use, about 30 MB of RAM), not as "
        "fresh processes: a load is about 70 ms sooner (docs/serve.md, fork servers). "
        "false: every child is a fresh process.",
    )
    warm_peg_budget: SizeOrShare = Field(
        default="25%",
        description="Host memory kept for the weight files of unloaded warm_peg models (their "
        "pages held resident, so the next load reads no disk): a size ('4GiB') or a share "
        "of host RAM ('25%'). Beyond it, the least recently used pegs are released.",
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
    prompt_preflight: bool | Literal["strict"] = Field(
        default=True,
        description="Count a request's prompt tokens with the model's tokenizer before it "
        "reaches the engine: a prompt that cannot fit the slot's context is refused (400); "
        "one that fits but whose requested output does not is served with the output "
        "capped to what fits (the response header x-blazar-max-tokens-capped names the "
        'cap). "strict" refuses that one too; false turns the preflight off.',
    )
    default_max_tokens: int = Field(
        default=128,
        ge=0,
        description="The output limit of a request that sets none, for a model whose GGUF "
        "carries no chat template (a base model, which rarely stops: without a limit it "
        "writes until its context is full; a template declared in the manifest does not "
        "teach it to stop). The answer says it was capped (finish reason length, the "
        "x-blazar-max-tokens-capped header). 128 was ollama's default num_predict for years: "
        "a paragraph, about 5 s on a CPU at 25 tokens/s; 0: no default. Per model: "
        "models.NAME.max_tokens.",
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
    relay: bool = Field(
        default=True,
        description="Carry a request that needs no rewrite (a chat, completion or embeddings "
        "request for a model as it is served) as bytes below the gateway's HTTP framework, "
        "the child's answer copied to the client as it arrives (docs/performance.md); false: "
        "every request takes the interpreted path.",
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
    # -- message batches (/v1/messages/batches; docs/compatibility.md) --
    batch_in_flight: int = Field(
        default=1,
        ge=1,
        description="Requests of message batches one model runs at once, all batches "
        "together; each starts only when the model has a free slot and no request waits "
        "in its queue, so interactive requests never wait behind a batch.",
    )
    batch_expiry: Duration = Field(
        default="24h",
        validate_default=True,
        description="How long a message batch may take (Anthropic's 24 hours): requests "
        "not run by then end `expired`.",
    )
    batch_retention: Duration = Field(
        default="696h",
        validate_default=True,
        description="How long an ended message batch and its results are kept after it "
        "was created (Anthropic's 29 days) before they are pruned.",
    )
    # -- images (models with an mmproj; docs/compatibility.md) --
    image_max_size: Size = Field(
        default="20MiB",
        validate_default=True,
        description="Largest image a request may carry (decoded) or the gateway fetches "
        "for an image URL; a larger one is refused with a 400.",
    )
    image_fetch_timeout: Duration = Field(
        default="10s",
        validate_default=True,
        description="Longest the gateway spends fetching one image URL (redirects "
        "included); a slower one is refused with a 400.",
    )
    image_fetch_networks: list[NonEmpty] = Field(
        default=[],
        description="Networks (CIDR, such as 10.1.0.0/16 or 127.0.0.1/32) the gateway may "
        "fetch image URLs from although they are private, loopback or link-local; every "
        "other such address is refused, after DNS resolution and on every redirect. "
        "Empty: public addresses only.",
    )
    max_connections_per_client: int = Field(
        default=128,
        ge=1,
        description="Open connections one client address may hold; more are answered 503 "
        "and closed. Every local process is the one client 127.0.0.1: raise it where many "
        "local tools share the gateway.",
    )

    # -- observability (docs/observability.md) --
    pii_scrub: bool = Field(
        default=False,
        description="Request traces keep no message text, only the lengths and hashes of "
        "prompts and outputs.",
    )
    sentinel: bool = Field(
        default=True,
        description="Check each answer with the sentinels (empty, truncated, invalid_json, "
        "schema_mismatch): found on its trace (`blazar why`) and counted. false: no check "
        "runs, and sentinel_enforce has nothing to enforce.",
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
    cache: ResponseCache = Field(
        default_factory=ResponseCache,
        description="The response cache, exact and semantic (docs/cache.md).",
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
        for index, network in enumerate(self.image_fetch_networks):
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise FieldError(
                    "image_fetch_networks",
                    f"image_fetch_networks[{index}] {network!r} is not a network",
                    "write it as CIDR, such as '10.1.0.0/16' or '127.0.0.1/32'",
                ) from None
        if self.image_fetch_timeout <= 0:
            raise FieldError(
                "image_fetch_timeout", "image_fetch_timeout must be a positive duration"
            )
        for name in ("batch_expiry", "batch_retention"):
            if getattr(self, name) <= 0:
                raise FieldError(name, f"{name} must be a positive duration such as '24h'")
        for name in ("header_timeout", "body_timeout"):
            if getattr(self, name) <= 0:
                raise FieldError(name, f"{name} must be a positive duration such as '30s'")
        return self
