"""The prefix-cache hit ratio Blazar shows is prompt tokens the engine reused over prompt
tokens, so never above 100%: three identical raw `/api/generate` calls showed "CACHE HIT
250%" in `blazar watch`, because llama-server's `tokens_cached` (every token in the slot's
cache, the generated ones included) was read as reused prompt tokens (issue 33, day one 8).
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import ollama
from prometheus_client.parser import text_string_to_metric_families

from blazar.testing.tiny import write_tiny_model
from tests.conftest import Blazar
from tests.fixtures import ENGINE, model_block
from tests.serving import Served


def counted(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("model") == "tiny"
    )


def test_raw_generate_counts_only_the_prompt_tokens_reused(
    blazar: Blazar, blazar_home: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(ENGINE + model_block("tiny", write_tiny_model(tmp_path / "t.gguf")))
    with Served(manifest, blazar_home) as served:
        client = ollama.Client(host=served.url)
        for _ in range(3):
            client.generate(
                model="tiny", prompt="hello there friend", raw=True, options={"num_predict": 5}
            )
        prompt = counted(served.url, "blazar_prompt_tokens_total")
        cached = counted(served.url, "blazar_prompt_tokens_cached_total")
        # The first call reuses nothing; the next two all but the prompt's last token.
        assert prompt > 0 and cached == 2 * (prompt / 3 - 1), (prompt, cached)
        screen = blazar("watch", "--once", "--url", served.url).output
        row = next(line for line in screen.splitlines() if line.startswith("tiny"))
        shown = int(row.split()[-1].rstrip("%"))
        assert shown == round(100 * cached / prompt) <= 100, screen
