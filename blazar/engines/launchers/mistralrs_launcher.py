"""Serve mistral.rs over OpenAI's HTTP API: the launcher of Blazar's mistralrs lane.

Blazar copies this file, with `launcher_common.py` beside it, into each mistralrs engine
(`blazar.engines.audio`); its supervisor runs it with that engine's Python, as it runs
llama-server:

    python mistralrs_launcher.py --model PATH --host H --port 0 [--alias NAME]
        [--ctx-size N] [--parallel N] [--threads N] [--chat-template JINJA]
    python mistralrs_launcher.py --version

PATH is a GGUF file or a safetensors model directory (config.json, *.safetensors,
tokenizer.json). The model is loaded first (the package's `Runner`, offline), then
the server listens and prints `mistralrs_launcher: listening on http://HOST:PORT`:
`/health` answers only once it can work (the skeleton, the flags and the HTTP side are
`launcher_common`'s). It serves GET /health, GET /v1/models, POST
/v1/chat/completions (streamed or not) and POST /v1/completions (a streamed one
arrives in one chunk: the package streams chat only), and no other API: the gateway
translates ollama's and Anthropic's. Answers carry `usage` and, as llama-server's
do, `timings` from mistral.rs's own figures (Blazar's bench and gate read them).
What mistral.rs cannot honour is a 400 in OpenAI's shape naming the reason
(`REFUSED`): LoRA adapters per request, KV sessions, GBNF grammars (a JSON schema in
`response_format` works), tools, logprobs, a seed per request. The context is the
model's own (--ctx-size is taken for llama-server's flag vocabulary). One request
runs at a time: the Runner refuses concurrent calls ("Already borrowed"), so the
others wait here. SIGTERM or SIGINT ends it. Standard library and mistralrs only.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import SplitResult

if __package__:  # imported as blazar.engines.launchers.mistralrs_launcher (Blazar's tests)
    from blazar.engines.launchers import launcher_common as common
else:  # run as a script in its engine's environment, launcher_common.py copied beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import launcher_common as common  # type: ignore[no-redef, import-not-found, unused-ignore]

PATHS = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health"
# Fields llama-server takes that mistral.rs cannot honour, and why: a 400 names the reason.
_ELSEWHERE = ", or serve the model from a llamacpp lane"
_NOT_HERE = "{} are not {} by mistral.rs lanes: send the request without them" + _ELSEWHERE
REFUSED = {
    "lora": "LoRA adapters per request are not applied by mistral.rs lanes (Blazar's "
    "adapters are llama.cpp GGUF adapters): serve `model+adapter` from a llamacpp lane",
    "id_slot": "KV sessions and slots are llama-server's (`/slots`); a mistral.rs lane keeps "
    "none: serve the model from a llamacpp lane to save and restore sessions",
    "grammar": "GBNF grammars are llama.cpp's; mistral.rs does not take them: send "
    "response_format {type: json_schema} instead" + _ELSEWHERE,
    "json_schema": "llama.cpp's json_schema field is not taken by mistral.rs: send "
    "response_format {type: json_schema, json_schema: {schema: ...}} instead",
    "tools": _NOT_HERE.format("tools", "translated"),
    "functions": _NOT_HERE.format("functions", "translated"),
    "logprobs": _NOT_HERE.format("logprobs", "returned"),
    "top_logprobs": _NOT_HERE.format("logprobs", "returned"),
    "n_probs": _NOT_HERE.format("token probabilities", "returned"),
    "seed": "mistral.rs takes a seed per engine, not per request: send the request without "
    "one" + _ELSEWHERE,
    "mirostat": "mirostat sampling is llama.cpp's; mistral.rs does not have it",
    "typical_p": "typical sampling is llama.cpp's; mistral.rs does not have it",
    "tfs_z": "tail-free sampling is llama.cpp's; mistral.rs does not have it",
    "repeat_last_n": "mistral.rs applies its repetition penalty to the whole context",
    "images": "this lane serves text only",
}
# Values that ask for nothing, so the field may be sent.
NEUTRAL: dict[str, Any] = {
    "logprobs": (False, None),
    "seed": (None,),
    "mirostat": (0, None),
    "typical_p": (1, 1.0, None),
    "tfs_z": (1, 1.0, None),
    "tools": ([],),
    "functions": ([],),
    "top_logprobs": (None, 0),
}
SAMPLING = {
    **{
        k: k
        for k in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        )
    },
    "repeat_penalty": "repetition_penalty",
}
LIMITS = ("max_completion_tokens", "max_tokens", "n_predict")


def not_served(path: str) -> str:
    return f"{path} is not served: this engine speaks OpenAI's API only ({PATHS})"


def parser() -> argparse.ArgumentParser:
    parser = common.flags(
        __doc__,
        "a GGUF file, or a safetensors model directory",
        "sequences per engine",
        "CPU threads (0: all cores)",
    )
    parser.add_argument("--alias", default=None, help="the model's name in answers")
    parser.add_argument("--ctx-size", type=int, default=0, help="tokens in all (0: the model's)")
    parser.add_argument("--threads-batch", type=int, default=0, help="accepted; as --threads")
    parser.add_argument("--chat-template", default=None, help="Jinja text of a chat template")
    return parser


def versions() -> str:
    from importlib.metadata import version

    return f"mistralrs {version('mistralrs')}"


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise common.BadRequest(f"{where}: a {kind!r} part: {REFUSED['images']}")
            out.append(str(part.get("text", "")))
        return "".join(out)
    raise common.BadRequest(f"{where} must be a string or a list of text parts")


def refuse_unsupported(body: dict[str, Any]) -> None:
    """A 400 for the first field this lane cannot honour (`REFUSED`)."""
    for name, why in REFUSED.items():
        if name in body and body[name] not in NEUTRAL.get(name, ()):
            if name == "tools" and body.get("tool_choice") == "none":
                continue
            raise common.BadRequest(f"'{name}' is not supported here: {why}")


def keywords(body: dict[str, Any]) -> dict[str, Any]:
    """The request keywords both endpoints share: limits, sampling, stop, n, format."""
    refuse_unsupported(body)
    out: dict[str, Any] = {}
    for name in LIMITS:
        if body.get(name) is not None:
            if not isinstance(body[name], int) or isinstance(body[name], bool):
                raise common.BadRequest(f"'{name}' must be an integer")
            out["max_tokens"] = body[name] if body[name] >= 0 else None
            break
    for name, keyword in SAMPLING.items():
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise common.BadRequest(f"'{name}' must be a number")
            out[keyword] = value
    if (stop := body.get("stop")) is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise common.BadRequest("'stop' must be a string or a list of strings")
        out["stop_seqs"] = stops or None
    if (n := body.get("n")) is not None:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 16:
            raise common.BadRequest("'n' must be an integer from 1 to 16")
        out["n_choices"] = n
    if isinstance(body.get("logit_bias"), dict) and body["logit_bias"]:
        try:
            out["logit_bias"] = {int(k): float(v) for k, v in body["logit_bias"].items()}
        except (TypeError, ValueError):
            raise common.BadRequest("'logit_bias' maps token ids to numbers") from None
    if body.get("ignore_eos") is True:
        out["ignore_eos"] = True
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        if fmt.get("type") == "json_object":
            schema: Any = {"type": "object"}
        elif fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
            schema = fmt["json_schema"].get("schema", {})
        else:
            raise common.BadRequest("response_format must be text, json_object or json_schema")
        out["grammar"], out["grammar_type"] = json.dumps(schema), "json_schema"
    return out


def chat_request(body: dict[str, Any], model: str) -> tuple[Any, bool, bool]:
    """(the package's ChatCompletionRequest, stream?, usage in the stream?)."""
    import mistralrs  # type: ignore[import-untyped, import-not-found, unused-ignore]

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise common.BadRequest("'messages' must be a non-empty list")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise common.BadRequest(f"messages[{i}] must be an object with a role")
        role = message["role"]
        if role == "tool" or message.get("tool_calls"):
            raise common.BadRequest(f"messages[{i}]: {REFUSED['tools']}")
        role = "system" if role == "developer" else role
        turns.append({"role": role, "content": _text(message.get("content"), f"messages[{i}]")})
    stream, options = body.get("stream") is True, body.get("stream_options")
    usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    asked = mistralrs.ChatCompletionRequest(
        messages=turns, model=model, stream=stream, **keywords(body)
    )
    return asked, stream, usage


def completion_request(body: dict[str, Any], model: str) -> Any:
    import mistralrs  # type: ignore[import-untyped, import-not-found, unused-ignore]

    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise common.BadRequest("'prompt' must be a string (one prompt per request on this lane)")
    kwargs = keywords(body)
    if body.get("echo") is True:
        kwargs["echo_prompt"] = True
    if isinstance(body.get("suffix"), str):
        kwargs["suffix"] = body["suffix"]
    if isinstance(body.get("best_of"), int) and not isinstance(body["best_of"], bool):
        kwargs["best_of"] = body["best_of"]
    return mistralrs.CompletionRequest(prompt=prompt, model=model, **kwargs)


def usage_json(usage: Any) -> dict[str, int]:
    return {k: getattr(usage, k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def timings_json(usage: Any, wall: float) -> dict[str, float]:
    """llama-server's `timings`, from mistral.rs's figures. It reports times in whole
    milliseconds, so a request shorter than that reads 0 tokens/s: then the figure is
    the request's wall-clock time (`wall` seconds, prompt included), a lower bound."""
    prompt_s, predicted_s = usage.total_prompt_time_sec, usage.total_completion_time_sec
    decode = float(usage.avg_compl_tok_per_sec)
    if decode <= 0 and usage.completion_tokens and wall > 0:
        decode, predicted_s = usage.completion_tokens / wall, wall
    return {
        "prompt_n": usage.prompt_tokens,
        "prompt_ms": round(prompt_s * 1000, 3),
        "prompt_per_second": float(usage.avg_prompt_tok_per_sec),
        "predicted_n": usage.completion_tokens,
        "predicted_ms": round(predicted_s * 1000, 3),
        "predicted_per_second": decode,
    }


def finish(reason: Any) -> str | None:
    return None if reason is None else "stop" if reason in ("eos", "canceled") else str(reason)


class Runner(common.Engine):
    """The loaded model, one request at a time."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        os.environ["HF_HUB_OFFLINE"] = "1"  # the model is on disk; the hub is never asked
        if args.threads > 0:  # read by the engine's thread pool when it starts
            os.environ["RAYON_NUM_THREADS"] = str(args.threads)
        import mistralrs  # type: ignore[import-untyped, import-not-found, unused-ignore]

        path = Path(args.model)
        if path.is_dir():
            which = mistralrs.Which.Plain(model_id=str(path))
        elif path.is_file():
            which = mistralrs.Which.GGUF(
                quantized_model_id=str(path.parent), quantized_filename=path.name
            )
        else:
            raise FileNotFoundError(f"no such model: {path}")
        options: dict[str, Any] = {"max_seqs": max(1, args.parallel), "token_source": "none"}
        self.template: Path | None = None  # the declared template, as the package reads it
        if args.chat_template:
            handle, name = tempfile.mkstemp(suffix=".jinja", prefix="mistralrs-template-")
            os.close(handle)
            self.template = Path(name)
            self.template.write_text(args.chat_template, "utf-8")
            options["jinja_explicit"] = name
        self.runner = mistralrs.Runner(which=which, **options)
        self.model = args.alias or path.name
        self.lock = threading.Lock()

    def close(self) -> None:
        if self.template is not None:
            self.template.unlink(missing_ok=True)


class RunnerHandler(common.Handler):
    engine: Runner

    def not_found(self, path: str) -> str:
        return not_served(path)

    def models(self, url: SplitResult, body: bytes) -> None:
        listed = {"id": self.engine.model, "object": "model", "created": 0, "owned_by": "mistralrs"}
        self.send_json(200, {"object": "list", "data": [listed]})

    def complete(self, url: SplitResult, raw: bytes) -> None:
        path = url.path
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise common.BadRequest("the body must be a JSON object")
            stream, usage = body.get("stream") is True, False
            if path == "/v1/chat/completions":
                request, stream, usage = chat_request(body, self.engine.model)
            else:
                request = completion_request(body, self.engine.model)
        except common.BadRequest as exc:
            self.send_error_json(400, str(exc))
            return
        except ValueError as exc:  # not JSON, or a value the package's request refused
            self.send_error_json(400, f"the request is malformed: {exc}")
            return
        with self.engine.lock:
            try:
                if path == "/v1/chat/completions":
                    self._chat(request, stream, usage)
                else:
                    self._completion(request, stream)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away: stop here
            except ValueError as exc:  # mistral.rs's word for a request it cannot run
                self.send_error_json(400, str(exc))
            except Exception as exc:
                print(f"mistralrs_launcher: {path} failed: {exc!r}", file=sys.stderr, flush=True)
                self.send_error_json(500, f"mistral.rs failed: {exc}", "server_error")

    GET: ClassVar[dict[str, common.Route]] = {"/v1/models": models}
    POST: ClassVar[dict[str, common.Route]] = {
        "/v1/chat/completions": complete,
        "/v1/completions": complete,
    }

    def _chat(self, request: Any, stream: bool, usage: bool) -> None:
        engine, began = self.engine, time.monotonic()
        if not stream:
            done = engine.runner.send_chat_completion_request(request)
            self.send_json(
                200,
                {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": engine.model,
                    "choices": [
                        {
                            "index": c.index,
                            "finish_reason": finish(c.finish_reason),
                            "message": {"role": "assistant", "content": c.message.content},
                        }
                        for c in done.choices
                    ],
                    "usage": usage_json(done.usage),
                    "timings": timings_json(done.usage, time.monotonic() - began),
                },
            )
            return
        chunks = iter(engine.runner.send_chat_completion_request(request))
        head = next(chunks, None)  # the engine's refusal comes here, before the headers go
        ident, created, last_usage = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), None
        self._start_stream()

        def event(choices: list[dict[str, Any]], **extra: Any) -> None:
            self._send(
                {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": engine.model,
                    "choices": choices,
                    **extra,
                }
            )

        event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        try:
            for chunk in itertools.chain([head] if head is not None else [], chunks):
                event(
                    [
                        {
                            "index": c.index,
                            "delta": {"content": c.delta.content or ""},
                            "finish_reason": finish(c.finish_reason),
                        }
                        for c in chunk.choices
                    ]
                )
                if chunk.usage is not None:
                    last_usage = chunk.usage
            if last_usage is not None:  # timings (and usage, when asked) in a last chunk
                extra = {"usage": usage_json(last_usage)} if usage else {}
                event([], timings=timings_json(last_usage, time.monotonic() - began), **extra)
            self._end_stream()
        finally:
            with contextlib.suppress(Exception):
                del chunks  # dropping the stream stops the generation

    def _completion(self, request: Any, stream: bool) -> None:
        engine, began = self.engine, time.monotonic()
        done = engine.runner.send_completion_request(request)
        timings = timings_json(done.usage, time.monotonic() - began)
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        choices = [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": None,
                "finish_reason": finish(c.finish_reason),
            }
            for c in done.choices
        ]
        answer = {
            "id": ident,
            "object": "text_completion",
            "created": created,
            "model": engine.model,
            "choices": choices,
        }
        if not stream:
            self.send_json(200, {**answer, "usage": usage_json(done.usage), "timings": timings})
            return
        self._start_stream()
        self._send({**answer, "timings": timings})
        self._end_stream()

    def _start_stream(self) -> None:
        self.start_chunked("text/event-stream", **{"Cache-Control": "no-cache"})

    def _send(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self.send_chunk(f"data: {text}\n\n".encode())

    def _end_stream(self) -> None:
        self._send("[DONE]")
        self.end_chunked()


def main(argv: list[str]) -> int:
    return common.serve_http("mistralrs_launcher", argv, parser(), versions, Runner, RunnerHandler)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
