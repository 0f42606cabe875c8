"""`[engines.NAME]` and `[engine_routing]`: engine lanes, the versions wanted, and how
models are routed to them; part of the manifest (`specs.manifest.Manifest`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from specs.fields import COMMIT, RELEASE_VERSION, WHEEL_VERSION, HttpUrl, LaneId, NonEmpty
from specs.problems import FieldError
from specs.tables import Table


class Engine(Table):
    """An engine lane: which kind of server, how it is installed, and the version wanted."""

    kind: Literal["llamacpp", "mistralrs", "whisper", "piper", "sdcpp"] = Field(
        default="llamacpp",
        description="The server: llamacpp (llama.cpp: chat, completions, embeddings), "
        "mistralrs (mistral.rs: chat and completions from GGUF or safetensors models, "
        "OpenAI's API only), whisper (faster-whisper: speech to text), piper (piper-tts: "
        "text to speech) or sdcpp (stable-diffusion.cpp's sd-server: images).",
    )
    install: Literal["wheel", "release", "source"] = Field(
        default="wheel",
        description="wheel: xllamacpp from PyPI (mistralrs, whisper and piper: the "
        "mistralrs, faster-whisper or piper-tts package, the only method for them); "
        "release: llama.cpp's release archives; source: a cmake build of a llama.cpp tree "
        "(sdcpp: sd-server built from the stable-diffusion-cpp-python sdist, the only "
        "method for it and its default).",
    )
    version: NonEmpty = Field(
        default="latest",
        description="'latest', or a pin: YEAR.MONTH.BUILD for the wheel (2026.10.11549), "
        "bNNNN for a release (b11549), bNNNN or a commit sha for a source build; for "
        "mistralrs, whisper and piper the package's version (mistralrs '0.9.5', "
        "faster-whisper '1.2.1', piper-tts '1.8.0'); for sdcpp the "
        "stable-diffusion-cpp-python sdist's ('0.4.7'; 'latest' is that one, the sdist "
        "checked to vendor sd-server).",
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

    @model_validator(mode="before")
    @classmethod
    def _sdist_by_default(cls, data: Any) -> Any:
        """An sdcpp engine that names no install method takes its only one (source)."""
        if isinstance(data, dict) and data.get("kind") in SOURCE_ENGINES and "install" not in data:
            return {**data, "install": "source"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Engine:
        if self.kind in PACKAGE_ENGINES:
            return self._packaged()
        if self.kind in SOURCE_ENGINES:
            return self._sdist()
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

    def _packaged(self) -> Engine:
        """mistralrs, whisper and piper: the wheel method only, on the CPU, with a package
        version."""
        for name, allowed in (("install", "wheel"), ("backend", "cpu")):
            if getattr(self, name) != allowed:
                raise FieldError(
                    name, f"a {self.kind} engine installs with {name} = {allowed!r} only"
                )
        for name in ("lane", "feed", "source"):
            if getattr(self, name) is not None:
                raise FieldError(name, f"{name} does not apply to a {self.kind} engine")
        if self.version != "latest" and not PACKAGE_VERSION.fullmatch(self.version):
            package = PACKAGE_ENGINES[self.kind]
            raise FieldError(
                "version",
                f"version {self.version!r} is not 'latest' or a {package} version such as "
                f"{PACKAGE_EXAMPLES[self.kind]!r}",
            )
        return self

    def _sdist(self) -> Engine:
        """sdcpp: sd-server built from its PyPI sdist (install = 'source'), on the CPU or
        with CUDA, at a version of that sdist."""
        package = SOURCE_ENGINES[self.kind]
        if self.install != "source":
            raise FieldError(
                "install",
                f"kind = {self.kind!r} installs with install = 'source' only (sd-server built "
                f"from the {package} sdist), not {self.install!r}",
                "write install = 'source' or leave install out",
            )
        for name in ("lane", "feed", "source"):
            if getattr(self, name) is not None:
                raise FieldError(
                    name,
                    f"{name} does not apply to kind = {self.kind!r}: it builds the {package} "
                    "sdist's vendored tree (version and backend apply)",
                    f"remove {name}",
                )
        if self.version != "latest" and not PACKAGE_VERSION.fullmatch(self.version):
            raise FieldError(
                "version",
                f"version {self.version!r} is not 'latest' or a {package} version such as "
                f"{PACKAGE_EXAMPLES[self.kind]!r}",
            )
        return self


# The speech engines and the PyPI package each installs (blazar.engines.audio).
AUDIO_ENGINES = {"whisper": "faster-whisper", "piper": "piper-tts"}
# Every engine installed from one PyPI package into a venv of its own: the speech ones and
# mistral.rs (a chat engine).
PACKAGE_ENGINES = {**AUDIO_ENGINES, "mistralrs": "mistralrs"}
# Engines built from a PyPI sdist that vendors their server's tree (blazar.engines.sdcpp),
# with the sdist's package: install = 'source', version = that package's.
SOURCE_ENGINES = {"sdcpp": "stable-diffusion-cpp-python"}
SDCPP_PINNED = "0.4.7"  # the sdist checked to vendor sd-server: what 'latest' installs
PACKAGE_EXAMPLES = {
    "whisper": "1.2.1",
    "piper": "1.8.0",
    "mistralrs": "0.9.5",
    "sdcpp": SDCPP_PINNED,
}
PACKAGE_VERSION = re.compile(r"[0-9]+(\.[0-9]+){1,3}")
# Fields that mean something for chat models only (llama-server's settings).


class EngineRouting(Table):
    """How each model is routed to an engine lane."""

    mode: Literal["auto", "manual"] = Field(
        default="auto",
        description="auto: each model runs on an engine that supports its GGUF architecture "
        "(mainstream, else an installed fork lane that adds it; a model's own engine pins "
        "it); manual: each model runs on its declared engine, or the default one.",
    )
    policy: Literal["mainstream", "fastest"] = Field(
        default="mainstream",
        description="Which lane a model runs on when several installed lanes can load it "
        "(auto mode): mainstream keeps the rules above; fastest picks the lane whose "
        "engine decoded this very model file fastest in the bench history (`blazar bench "
        "MODEL --engine TAG` measures one) once the lane the rules pick is measured too: "
        "measured, never assumed. `blazar ps --json` names each model's choice (`route`).",
    )
    chat_kind: Literal["llamacpp", "mistralrs"] = Field(
        default="llamacpp",
        description="The kind of engine chat models that name none run on: llamacpp (routed "
        "by GGUF architecture among the llama.cpp lanes) or mistralrs. `blazar engine use "
        "--kind KIND` sets it.",
    )
    fork_retire_days: int = Field(
        default=14,
        ge=0,
        description="Days a fork lane keeps its models once the active mainstream engine "
        "supports every architecture it adds; then they move to mainstream and the fork is "
        "removed.",
    )
