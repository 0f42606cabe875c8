"""A small MCP server for the tests, written with the `mcp` package (the reference SDK).

    python tests/mcp_weather.py [stdio | http PORT] [--only NAME,...] [--exit-after N]
                                [--marker PATH]

Tools: `get_weather(city)` answers "sunny, 21C" (the report tests/test_mcp_served.py
and the SDK's tests look for in the model's answer), `add(a, b)` the sum, `broken()`
always fails (its error goes back as the tool's result); `--only` offers just the tools
it names. With `--exit-after N` the
server exits after its N-th tool call (serve must restart it); with `--marker PATH` it
appends a line to PATH for every call, so a test sees which calls reached it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

REPORT = "sunny, 21C"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", nargs="?", default="stdio", choices=("stdio", "http"))
    parser.add_argument("port", nargs="?", type=int, default=0)
    parser.add_argument("--exit-after", type=int, default=0)
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    server = MCPServer("weather", log_level="WARNING")
    calls = [0]

    def called(what: str) -> None:
        calls[0] += 1
        if args.marker is not None:
            with args.marker.open("a") as marker:
                marker.write(f"{os.getpid()} {what}\n")
        if args.exit_after and calls[0] >= args.exit_after:
            print(f"exiting after {calls[0]} calls", file=sys.stderr, flush=True)
            os._exit(3)

    def get_weather(city: str) -> str:
        """The weather in a city"""
        called(f"get_weather {city}")
        return REPORT

    def add(a: int, b: int) -> int:
        """Add two whole numbers"""
        called(f"add {a} {b}")
        return a + b

    def broken() -> str:
        """A tool that always fails"""
        called("broken")
        raise RuntimeError("the weather service is down")

    only = args.only.split(",") if args.only else None
    for tool in (get_weather, add, broken):
        if only is None or tool.__name__ in only:
            server.tool()(tool)
    if args.transport == "http":
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
