"""The workloads `blazar tune` measures with: files shipped in the package, or the user's.

Each workload is a TOML file (`blazar/tune/workloads/NAME.toml`): a description, the
tokens each request generates (`predict`), whether requests keep the prompt cache
(`cache_prompt`, off unless said: each run then pays for its prompt, as new prompts
would), and the requests, either listed (`[[requests]] prompt = "..."`) or made from a
`document` with `edits` put before it and `questions` after it (the long-prompt one,
for `cache_reuse`). Shipped:

- `repetitive`: code and config edits whose answers repeat their input (n-gram lookup's
  best case);
- `chat`: open questions answered in new words (where speculative decoding may lose);
- `long-prompt`: a long document edited near its start between questions.

Requests go to the engine's own `/completion` with the raw prompt, so a model without a
chat template (Gemma 3 270M's GGUF) is measured the same way as one with.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from blazar.errors import InvalidInput

SHIPPED = Path(__file__).with_name("workloads")
NAMES = ("repetitive", "chat", "long-prompt")


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    prompts: tuple[str, ...]
    predict: int
    cache_prompt: bool = False

    def limited(self, requests: int | None, predict: int | None) -> Workload:
        """The first `requests` requests, each generating `predict` tokens (None: as is)."""
        prompts = self.prompts[:requests] if requests else self.prompts
        return Workload(
            self.name, self.description, prompts, predict or self.predict, self.cache_prompt
        )


def load_workload(name_or_path: str) -> Workload:
    """A shipped workload by name, or a workload file by path."""
    path = SHIPPED / f"{name_or_path}.toml" if name_or_path in NAMES else Path(name_or_path)
    if not path.is_file():
        raise InvalidInput(
            f"no workload {name_or_path!r}: name one Blazar ships ({', '.join(NAMES)}) or "
            "the path of a workload file (docs/tune.md says what it holds)"
        )
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"workload {path} cannot be read: {exc}") from None
    prompts: list[object] = [
        r.get("prompt") for r in data.get("requests") or [] if isinstance(r, dict)
    ]
    document = data.get("document")
    if isinstance(document, str):
        edits, questions = data.get("edits") or [""], data.get("questions") or []
        prompts += [
            f"{edit}\n\n{document}\nQuestion: {question}\nAnswer:"
            for edit, question in zip(edits, questions, strict=False)
        ]
    predict = data.get("predict", 48)
    texts = [p for p in prompts if isinstance(p, str) and p]
    if not texts or len(texts) != len(prompts):
        raise InvalidInput(f"workload {path} has no requests: give [[requests]] prompt = '...'")
    if not isinstance(predict, int) or predict < 1:
        raise InvalidInput(f"workload {path}: predict must be a positive integer")
    return Workload(
        name=name_or_path if name_or_path in NAMES else str(path),
        description=str(data.get("description") or ""),
        prompts=tuple(texts),
        predict=predict,
        cache_prompt=bool(data.get("cache_prompt", False)),
    )
