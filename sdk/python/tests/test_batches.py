"""`Client.batches`: Anthropic's Message Batches shapes, ready for the gateway's route.

Blazar does not serve `/v1/messages/batches` yet. What can be checked now: the
methods and paths are the ones the official `anthropic` package calls (read out
of its source), a batch's requests have the fields its `BatchCreateParams`
declares and are checked before anything is sent, and the real gateway's answer
today arrives as a typed error in Anthropic's envelope.
"""

from __future__ import annotations

import inspect
import re

import anthropic.resources.messages.batches as official
import pytest
from anthropic.types.messages import batch_create_params

from blazar_sdk import Client, NotFoundError
from blazar_sdk.batches import ROUTES, check_requests

# Official client method -> the SDK's name for the same call.
NAMES = {"create": "create", "retrieve": "get", "list": "list", "results": "results",
         "cancel": "cancel", "delete": "delete"}  # fmt: skip
VERB = re.compile(r"self\._(get|post|delete|get_api_list)\(")
ROUTE = re.compile(r'span_route="([^"]+)"')


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


def test_the_gateway_answers_in_anthropics_envelope_until_the_route_exists(client: Client) -> None:
    params = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(NotFoundError) as refused:
        client.batches.create([{"custom_id": "a", "params": params}])
    assert refused.value.code == "not_found_error"  # Anthropic's error type
    assert refused.value.body["type"] == "error" and refused.value.trace_id
    assert "POST /v1/messages/batches: no such endpoint" in refused.value.message
