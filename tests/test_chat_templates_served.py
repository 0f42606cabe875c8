"""Chat templates that render, as a user would notice: through `blazar serve`, every route.

The bug this pins: a built-in name was passed as `--chat-template NAME` with
`--jinja`, and llama.cpp then took it as Jinja text, so every prompt of a model
declared with `chat_template = "gemma"` was the word "gemma" and its prompt
token count never changed. One `blazar serve` runs a tiny model whose GGUF has
no template once per built-in name (and once each for Jinja text and a file);
the official clients ask every chat route; a prompt must grow with the message
and the child's `/apply-template` must show the message. The shipped templates
are also held to llama.cpp's own (non-Jinja) rendering of the same names.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from blazar.launch.served_template import builtin_text
from blazar.testing.tiny import write_tiny_model
from specs.chat_templates import BUILTIN_TEMPLATES
from tests.fixtures import ENGINE, WHEELS
from tests.golden.engine import running_engine
from tests.serving import Served

SYSTEM = "answer briefly"
SHORT = "hi"
LONG = "hi, tell me about the quick brown fox that jumps over the lazy dog by the old river bank"
# Jinja text of the manifest's own, and the same from a file beside the manifest.
OWN = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}<<assistant>>"
MODELS = {f"t-{name}": name for name in BUILTIN_TEMPLATES}
MODELS |= {"t-text": OWN, "t-file": "templates/own.jinja", "t-gone": "templates/gone.jinja"}
TOOLED = ("chatml", "llama3", "mistral-v3", "mistral-v7")
REFUSED = (openai.BadRequestError, ollama.ResponseError, anthropic.BadRequestError)


class Clients:
    def __init__(self, served: Served, plain: Path) -> None:
        self.served = served
        self.plain = plain  # the tiny GGUF every model serves
        self.openai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0)
        self.ollama = ollama.Client(host=served.url)

    def child(self, model: str) -> str:
        """The URL of `model`'s child (loaded by a request before)."""
        [port] = [row["port"] for row in self.served.ps() if row["model"] == model]
        return f"http://127.0.0.1:{port}"

    def apply_template(self, model: str, body: dict[str, Any]) -> str:
        request = urllib.request.Request(
            self.child(model) + "/apply-template",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            return str(json.load(resp)["prompt"])


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    """One `blazar serve` for the whole module: each model loads in about 50 ms."""
    root = tmp_path_factory.mktemp("templates")
    plain = write_tiny_model(root / "plain.gguf", chat_template=None)
    (root / "templates").mkdir()
    (root / "templates" / "own.jinja").write_text(OWN)
    text = f"[serving]\nmax_loaded_models = {len(MODELS)}\n\n"
    text += ENGINE
    for model, template in MODELS.items():
        text += f'[models.{model}]\nsource = "{plain.as_uri()}"\nctx = 1024\n'
        text += f"chat_template = {json.dumps(template)}\n\n"
    manifest = root / "blazar.toml"
    manifest.write_text(text)
    home = root / "home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        with Served(manifest, home) as served:
            yield Clients(served, plain)


def prompt_tokens(c: Clients, model: str, message: str) -> dict[str, int]:
    """Each chat route's prompt token count for one user message under a system prompt."""
    chat = c.openai.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": message}],
        max_tokens=1,
    )
    assert chat.usage is not None
    ollama_chat = c.ollama.chat(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": message}],
        options={"num_predict": 1},
    )
    generate = c.ollama.generate(
        model=model, system=SYSTEM, prompt=message, options={"num_predict": 1}
    )
    messages = c.anthropic.messages.create(
        model=model, system=SYSTEM, messages=[{"role": "user", "content": message}], max_tokens=1
    )
    # Anthropic's input_tokens leaves out what the prompt cache read back.
    usage = messages.usage
    counted = c.anthropic.messages.count_tokens(
        model=model, system=SYSTEM, messages=[{"role": "user", "content": message}]
    )
    return {
        "/v1/chat/completions": chat.usage.prompt_tokens,
        "/api/chat": int(ollama_chat.prompt_eval_count or 0),
        "/api/generate": int(generate.prompt_eval_count or 0),
        "/v1/messages": usage.input_tokens + (usage.cache_read_input_tokens or 0),
        "/v1/messages/count_tokens": counted.input_tokens,
    }


@pytest.mark.parametrize("model", [m for m in MODELS if m != "t-gone"])
def test_every_chat_route_renders_the_messages(clients: Clients, model: str) -> None:
    short, long = prompt_tokens(clients, model, SHORT), prompt_tokens(clients, model, LONG)
    for route in short:
        # LONG adds 17 words; a prompt that stayed the template's own text would not move.
        assert long[route] >= short[route] + 10, (model, route, short[route], long[route])
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": LONG}]
    rendered = clients.apply_template(model, {"messages": messages})
    assert SYSTEM in rendered and LONG in rendered, rendered


# The two built-ins that differ from llama.cpp's rendering of the same name, on purpose.
DIFFERENT = {
    # Meta's Llama 2 chat format: <<SYS>>, and <s>[INST] ... [/INST] answer </s> per turn
    # (llama.cpp drops the first <s>: the tokenizer adds it).
    "llama2": "[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nhello [/INST] hi there </s>"
    "<s>[INST] again [/INST]",
    # Turns end with the model's end-of-sequence token (</s> for Zephyr 7B and this model),
    # where llama.cpp writes <|endoftext|> (StableLM Zephyr's).
    "zephyr": "<|system|>\nbe brief</s>\n<|user|>\nhello</s>\n<|assistant|>\nhi there</s>\n"
    "<|user|>\nagain</s>\n<|assistant|>\n",
}
CONVERSATIONS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "again"},
    ],
]


@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_shipped_templates_render_as_llama_cpp_renders_the_name(
    clients: Clients, name: str
) -> None:
    """llama.cpp's own C++ rendering of each name (without --jinja) is the oracle."""
    model = f"t-{name}"
    clients.openai.completions.create(model=model, prompt="a", max_tokens=1)  # load it
    if name in DIFFERENT:
        rendered = clients.apply_template(model, {"messages": CONVERSATIONS[2]})
        assert rendered == DIFFERENT[name]
        return
    with running_engine(clients.plain, "--no-jinja", "--chat-template", name) as own:
        for messages in CONVERSATIONS:
            for generation in (True, False):
                body = {"messages": messages, "add_generation_prompt": generation}
                status, expected = own.post("/apply-template", body)
                assert status == 200, expected
                assert clients.apply_template(model, body) == expected["prompt"], body


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_ROUND = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call12345",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call12345", "content": "sunny, 21C"},
]


@pytest.mark.parametrize("name", TOOLED)
def test_tools_and_tool_results_render(clients: Clients, name: str) -> None:
    model = f"t-{name}"
    without = clients.openai.chat.completions.create(
        model=model, messages=TOOL_ROUND[:1], max_tokens=1
    )
    with_tools = clients.openai.chat.completions.create(
        model=model, messages=TOOL_ROUND[:1], tools=TOOLS, max_tokens=1
    )
    assert without.usage is not None and with_tools.usage is not None
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 20
    rendered = clients.apply_template(model, {"messages": TOOL_ROUND, "tools": TOOLS})
    for text in ("get_weather", "The weather in a city", '"city": "Paris"', "sunny, 21C"):
        assert text in rendered, (text, rendered)
    with urllib.request.urlopen(clients.child(model) + "/props", timeout=10) as resp:
        caps = json.load(resp)["chat_template_caps"]
    assert caps["supports_tools"] and caps["supports_tool_calls"], caps


def test_show_reports_the_applied_template_and_a_broken_one_refuses_chat(
    clients: Clients,
) -> None:
    shown = clients.ollama.show("t-gemma")
    assert shown.template == builtin_text("gemma")
    assert "tools" not in (shown.capabilities or [])
    assert "tools" in (clients.ollama.show("t-chatml").capabilities or [])
    assert clients.ollama.show("t-file").template == OWN

    # A declared file that is missing: chat is refused naming it, completions still work.
    assert clients.ollama.show("t-gone").template == ""
    refusals: list[Callable[[], object]] = [
        lambda: clients.openai.chat.completions.create(
            model="t-gone", messages=[{"role": "user", "content": "x"}], max_tokens=1
        ),
        lambda: clients.ollama.chat(model="t-gone", messages=[{"role": "user", "content": "x"}]),
        lambda: clients.anthropic.messages.create(
            model="t-gone", messages=[{"role": "user", "content": "x"}], max_tokens=1
        ),
    ]
    for refused in refusals:
        with pytest.raises(REFUSED) as info:
            refused()
        message = str(info.value)
        assert "cannot chat" in message and "gone.jinja cannot be read" in message, message
    done = clients.openai.completions.create(model="t-gone", prompt="the quick", max_tokens=2)
    assert done.usage is not None and done.usage.prompt_tokens > 0
