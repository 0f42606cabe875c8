"""`Client.batches`: Anthropic's Message Batches API, against the gateway's route.

The methods and paths are the ones the official `anthropic` package calls (read
out of its source), a batch's requests have the fields its `BatchCreateParams`
declares and are checked before anything is sent, and on the real gateway a
batch runs (each result the answer to its own request), a bad request refuses
it with a typed error in Anthropic's envelope, and a cancel ends it.
"""

from __future__ import annotations

import inspect
import re
import time
from typing import Any

import anthropic.resources.messages.batches as official
import pytest
from anthropic.types.messages import batch_create_params

from blazar_sdk import BadRequestError, BlazarError, Client, NotFoundError
from blazar_sdk.batches import ROUTES, check_requests

# Official client method -> the SDK's name for the same call.
NAMES = {
    "create": "create",
    "retrieve": "get",
    "list": "list",
    "results": "results",
    "cancel": "cancel",
    "delete": "delete",
}
VERB = re.compile(r"self\._(get|post|delete|get_api_list)\(")
ROUTE = re.compile(r'span_route="([^"]+)"')
HI = [{"role": "user", "content": "hi"}]


def test_methods_and_paths_are_anthropics() -> None:
    for theirs, ours in NAMES.items():
        source = inspect.getsource(getattr(official.Batches, theirs))
        verb, [path] = VERB.findall(source)[-1], ROUTE.findall(source)
        method = {"get_api_list": "GET"}.get(verb, verb.upper())
        assert ROUTES[ours] == (method, path.replace("{message_batch_id}", "{id}")), theirs
    assert set(ROUTES) == set(NAMES.values())


def test_requests_have_anthropics_fields_and_are_checked_first() -> None:
    params = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    requests = check_requests([{"custom_id": "a", "params": params}])
    assert set(requests[0]) == set(batch_create_params.Request.__annotations__)
    for bad, says in (
        ([], "non-empty list"),
        ([{"params": params}], "requests[0]: needs a custom_id"),
        ([{"custom_id": "a", "params": params}] * 2, "custom_id 'a' is used twice"),
        ([{"custom_id": "a", "params": {"max_tokens": 1}}], "params must be a Messages request"),
    ):
        with pytest.raises(ValueError) as refused:
            check_requests(bad)
        assert says in str(refused.value)


def _ended(client: Client, batch_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (batch := client.batches.get(batch_id))["processing_status"] != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)
    return batch


def test_a_batch_runs_on_the_gateway(client: Client) -> None:
    requests = [
        {"custom_id": f"r{n}", "params": {"model": "tiny", "max_tokens": n, "messages": HI}}
        for n in (3, 5)
    ]
    batch = client.batches.create(requests)
    assert batch["type"] == "message_batch" and batch["processing_status"] == "in_progress"
    assert batch["request_counts"]["processing"] == 2
    ended = _ended(client, batch["id"])
    assert ended["request_counts"]["succeeded"] == 2 and ended["results_url"]
    lines = {line["custom_id"]: line["result"] for line in client.batches.results(batch["id"])}
    assert sorted(lines) == ["r3", "r5"]
    for custom_id, result in lines.items():  # each the answer to its own request
        assert result["type"] == "succeeded"
        assert result["message"]["usage"]["output_tokens"] == int(custom_id[1:])
    assert batch["id"] in [b["id"] for b in client.batches.list(limit=5)["data"]]
    assert client.batches.delete(batch["id"]) == {
        "id": batch["id"],
        "type": "message_batch_deleted",
    }
    with pytest.raises(NotFoundError) as gone:
        client.batches.get(batch["id"])
    assert gone.value.code == "not_found_error" and gone.value.trace_id


def test_a_bad_request_refuses_the_batch_and_a_cancel_ends_it(client: Client) -> None:
    good = {"model": "tiny", "max_tokens": 200, "messages": HI}
    with pytest.raises(BadRequestError) as refused:
        nope = {**good, "model": "nope"}
        client.batches.create(
            [{"custom_id": "a", "params": good}, {"custom_id": "b", "params": nope}]
        )
    assert "requests[1] (custom_id 'b'): model 'nope' not found" in refused.value.message
    assert refused.value.code == "invalid_request_error"
    batch = client.batches.create([{"custom_id": f"c{i}", "params": good} for i in range(12)])
    with pytest.raises(BlazarError, match="has no results yet"):
        next(client.batches.results(batch["id"]))
    assert client.batches.cancel(batch["id"])["cancel_initiated_at"]
    ended = _ended(client, batch["id"])
    assert ended["request_counts"]["canceled"] >= 10, ended
    kinds = {line["result"]["type"] for line in client.batches.results(batch["id"])}
    assert "canceled" in kinds and kinds <= {"canceled", "succeeded"}
