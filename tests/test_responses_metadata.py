"""`POST /v1/responses/{id}`: a stored response's metadata replaced, within OpenAI's bounds.

The bounds (`openai_responses.check_metadata`) as a table; the size the gateway's
memory counts after an update (`Recent.set_metadata`); and on a real `blazar serve`,
a response made and read back with the official `openai` client, its metadata
updated over HTTP (the client has no call for it; `blazar_sdk.Client.metadata_update`
is one), bad updates refused in OpenAI's shape, unknown ids a 404.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from blazar.protocols import ProtocolError
from blazar.protocols.openai_responses import check_metadata, responses_request
from blazar.serve.routes.responses_api import Recent
from blazar.testing.tiny import write_tiny_model
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.serving import Served


@pytest.mark.parametrize(
    ("metadata", "refusal"),
    [
        ({}, None),
        ({f"k{i}": "v" for i in range(16)}, None),
        ({"k" * 64: "v" * 512}, None),
        ([], "metadata: expected an object of strings"),
        ({f"k{i}": "v" for i in range(17)}, "metadata: at most 16 keys, got 17"),
        ({"k" * 65: "v"}, "is longer than 64 chars"),
        ({"k": "v" * 513}, "metadata.k: longer than 512 characters"),
        ({"k": 1}, "metadata.k: expected a string, got int"),
    ],
)
def test_metadata_bounds(metadata: Any, refusal: str | None) -> None:
    if refusal is None:
        assert check_metadata(metadata) == metadata
        return
    with pytest.raises(ProtocolError) as refused:
        check_metadata(metadata)
    assert refused.value.status == 400 and refusal in refused.value.message
    with pytest.raises(ProtocolError):  # the same bounds when a response is made
        responses_request({"model": "m", "input": "x", "metadata": metadata})


def test_an_update_is_counted_at_its_new_size_and_makes_the_response_newest() -> None:
    recent = Recent(count=3)
    for n in range(3):
        recent.keep(None, {"id": f"resp_{n}", "metadata": {}}, [], [])
    kept = recent.find("resp_0", None)
    assert kept is not None
    recent.set_metadata(kept, {"topic": "x" * 500})
    assert kept.size == len(orjson.dumps([kept.response, kept.history]))
    recent.keep(None, {"id": "resp_3", "metadata": {}}, [], [])  # the oldest goes: resp_1
    assert recent.find("resp_0", None) is kept and recent.find("resp_1", None) is None


def test_metadata_of_a_stored_response_is_updated_on_serve(
    tmp_path: Path, blazar_home: Path
) -> None:
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    manifest = write_manifest(tmp_path, ENGINE + model_block("tiny", tiny, ctx=512))
    with Served(manifest, blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        made = oai.responses.create(
            model="tiny", input="hello", max_output_tokens=2, metadata={"run": "1"}
        )
        url = f"{served.url}/v1/responses/{made.id}"
        updated = httpx.post(url, json={"metadata": {"run": "2", "by": "sdk"}}, timeout=30)
        assert updated.status_code == 200, updated.text
        assert updated.json()["metadata"] == {"run": "2", "by": "sdk"}
        assert updated.headers["x-request-id"]
        kept = oai.responses.retrieve(made.id)
        assert kept.metadata == {"run": "2", "by": "sdk"}
        assert kept.output_text == made.output_text  # nothing else changed

        too_many = {"metadata": {f"k{i}": "v" for i in range(17)}}
        for body, says in (
            (too_many, "metadata: at most 16 keys, got 17"),
            ({"metadata": {"run": "3"}, "model": "x"}, "only metadata can be updated"),
        ):
            refused = httpx.post(url, json=body, timeout=30)
            assert refused.status_code == 400
            assert says in refused.json()["error"]["message"]
        assert oai.responses.retrieve(made.id).metadata == {"run": "2", "by": "sdk"}
        gone = httpx.post(f"{served.url}/v1/responses/resp_nope", json={"metadata": {}})
        assert gone.status_code == 404
        assert "no response 'resp_nope' to update" in gone.json()["error"]["message"]
