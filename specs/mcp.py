"""`[mcp.NAME]`: the MCP servers whose tools the gateway offers models; part of
`specs.manifest.Manifest`.

A server is either a program serve starts and talks to over its stdin and stdout
(`command`, with `env`), or a remote server reached over MCP's streamable HTTP
(`url`, with a key from `key_env`). `blazar serve` supervises each (docs/mcp.md);
a chat request names the ones it wants in its `mcp` field.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from specs.durations import Duration
from specs.fields import EnvName, HttpUrl, NonEmpty
from specs.problems import FieldError
from specs.tables import Table


class McpServer(Table):
    """An MCP server: its tools are offered to a model when a chat request names it in
    `mcp`, and the gateway calls them (docs/mcp.md)."""

    command: list[NonEmpty] = Field(
        default=[],
        description='The program and its arguments, such as ["python3", "weather.py"]: serve '
        "starts it and speaks MCP over its stdin and stdout (stderr goes to its log). Either "
        "this or url.",
    )
    env: dict[EnvName, str] = Field(
        default={},
        description="Environment variables added to serve's for the command.",
    )
    url: HttpUrl | None = Field(
        default=None,
        description="The endpoint of a remote MCP server (streamable HTTP), such as "
        "https://tools.example/mcp. Either this or command.",
    )
    key_env: EnvName | None = Field(
        default=None,
        description="Environment variable holding the key sent to the url (`Authorization: "
        "Bearer`); never the key itself.",
    )
    timeout: Duration = Field(
        default="60s",
        validate_default=True,
        description="Longest a tool call may take; past it the model gets the timeout as the "
        "tool's result. Starting (up to the tool list) has the same limit.",
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if bool(self.command) == (self.url is not None):
            raise FieldError(
                "command" if self.command else "url",
                "an MCP server needs either command (a program serve starts) or url (a "
                "remote server), not both"
                if self.command
                else "an MCP server needs either "
                "command (a program serve starts) or url (a remote server)",
                'for example command = ["python3", "weather.py"]',
            )
        if self.url is not None and self.env:
            raise FieldError("env", "env is for a command; a url server runs elsewhere")
        if self.command and self.key_env is not None:
            raise FieldError("key_env", "key_env is for a url; pass a command's key in env")
        if not self.timeout > 0:
            raise FieldError("timeout", "timeout must be a positive duration, such as '60s'")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"
