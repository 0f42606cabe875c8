"""blazar-sdk: Blazar's gateway from Python, standard library only (Python 3.9+).

    from blazar_sdk import Client

    client = Client()  # BLAZAR_URL / BLAZAR_API_KEY, else http://127.0.0.1:11435
    print(client.chat("qwen3-0.6b", "Hello").text)

`Client` (blazar_sdk.client) holds the calls; the exceptions are in
blazar_sdk.errors, the answer types in blazar_sdk.types. docs/sdk.md in
Blazar's repository documents every call with an example.
"""

from __future__ import annotations

from blazar_sdk.batches import Batches
from blazar_sdk.chat import ChatStream
from blazar_sdk.client import Client
from blazar_sdk.errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BlazarError,
    BusyError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RealtimeError,
    ServerError,
    ToolError,
    ToolLoopError,
    UpstreamError,
)
from blazar_sdk.realtime import Realtime
from blazar_sdk.tools import function_tool
from blazar_sdk.types import Candidate, ChatResult, Delta, ToolCallDelta

__version__ = "0.1.0"

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "Batches",
    "BlazarError",
    "BusyError",
    "Candidate",
    "ChatResult",
    "ChatStream",
    "Client",
    "ConflictError",
    "Delta",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "Realtime",
    "RealtimeError",
    "ServerError",
    "ToolCallDelta",
    "ToolError",
    "ToolLoopError",
    "UpstreamError",
    "__version__",
    "function_tool",
]
