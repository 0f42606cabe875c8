"""OpenAI's error envelope, for the gateway's `/v1/*` routes.

OpenAI-compatible requests go to llama-server nearly untouched, so the gateway
needs no translator for them, only one error shape for what it refuses itself (an
unknown model, a full queue, a crashed child):

    {"error": {"message": "...", "type": "invalid_request_error", "param": null,
               "code": "model_not_found"}}

The gateway calls `error(status, message)`; `from_protocol_error` turns a
`ProtocolError` from any translator into the same shape.
"""

from __future__ import annotations

from typing import Any

from blazar.protocols import ProtocolError

__all__ = ["STATUS_TYPES", "error", "error_type", "from_protocol_error"]

# status -> (type, code) as the gateway answers them; OpenAI's own API uses these
# types, and the codes name Blazar's reasons where OpenAI has none.
STATUS_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", None),
    501: ("invalid_request_error", "not_supported"),
    502: ("server_error", "upstream_error"),
    503: ("server_error", "all_slots_busy"),
    504: ("server_error", "upstream_timeout"),
}


def error_type(status: int) -> tuple[str, str | None]:
    """The (type, code) an error with this HTTP status gets."""
    if status in STATUS_TYPES:
        return STATUS_TYPES[status]
    return ("server_error", None) if status >= 500 else ("invalid_request_error", None)


def error(
    status: int,
    message: str,
    type_: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error body; type and code default to the status mapping."""
    default_type, default_code = error_type(status)
    return {
        "error": {
            "message": message,
            "type": type_ or default_type,
            "param": param,
            "code": code if code is not None else default_code,
        }
    }


def from_protocol_error(exc: ProtocolError) -> dict[str, Any]:
    """The OpenAI error body for a translator's refusal."""
    return error(exc.status, exc.message, code=exc.code)
