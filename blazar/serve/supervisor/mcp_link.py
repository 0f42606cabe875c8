"""The connection to one MCP server: JSON-RPC requests and their answers, by id.

`StdioLink` talks over the pipes of a child that `blazar.serve.supervisor.mcp_server`
spawned and owns (one message per line; stderr goes to the child's log);
`HttpLink` POSTs each message to a remote server's streamable-HTTP endpoint (the
answer as JSON or as server-sent events; the `Mcp-Session-Id` the server gives is sent
back). Both answer what the server asks of the client with "method not found" and
report its notifications (`tools/list_changed`) to the owner. Requests from several
tasks may be in flight at once; each waits at most its timeout.

Hand-written rather than the `mcp` package's client: that client pulls starlette,
uvicorn, httpx and pyjwt into serve (importing it took 2.3-2.7 s here, on a loaded
machine, against 0.7 s for aiohttp, which serve has anyway), and it spawns stdio
servers itself, which would make a second owner of child processes beside
`blazar.host.children`. The tests check this client against servers written with the
`mcp` package, over both transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from blazar.host.children import ChildLog
from blazar.protocols import mcp
from blazar.protocols.mcp import McpProtocolError
from blazar.protocols.sse import SSEDecoder

Notice = Callable[[str], None]  # a notification's method, for the owner


class Link(Protocol):
    async def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any: ...

    async def notify(self, method: str) -> None: ...

    async def close(self) -> None: ...


class StdioLink:
    """JSON-RPC over a child's stdin and stdout. `reader` ends when stdout does (the child
    exited or closed it): every request still waiting fails then."""

    def __init__(self, proc: asyncio.subprocess.Process, log: ChildLog, on_notice: Notice) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc, self.log, self.on_notice = proc, log, on_notice
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.reader = asyncio.create_task(self._read())
        self._errors = asyncio.create_task(self._read_stderr())

    async def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        msg_id = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = answer
        try:
            await self._send(mcp.request(msg_id, method, params))
            async with asyncio.timeout(timeout):
                return mcp.outcome(await answer)
        except TimeoutError:
            raise McpProtocolError(f"{method}: no answer within {timeout:g} s") from None
        finally:
            self._waiting.pop(msg_id, None)

    async def notify(self, method: str) -> None:
        await self._send(mcp.notification(method))

    async def _send(self, line: bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        if self.reader.done() or stdin.is_closing():
            raise McpProtocolError("the server's pipes are closed")
        try:
            stdin.write(line + b"\n")
            await stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise McpProtocolError(f"the server's stdin is closed ({exc})") from None

    async def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            while raw := await stdout.readline():
                if raw.strip():
                    await self._received(raw)
        except ValueError:  # a line past the limit: nothing after it can be trusted
            self.log.note("a message over the line limit: the link is closed")
        finally:
            self._fail_all(McpProtocolError("the server closed its output"))

    async def _received(self, raw: bytes) -> None:
        try:
            message = mcp.parse(raw)
        except McpProtocolError as exc:  # a stray print on stdout: logged, not fatal
            self.log.line(f"(stdout) {exc}")
            return
        msg_id, method = message.get("id"), message.get("method")
        if isinstance(method, str):
            if msg_id is not None:  # the server asks something of the client
                with contextlib.suppress(McpProtocolError):
                    await self._send(mcp.method_not_found(msg_id, method))
            else:
                self.on_notice(method)
            return
        waiter = self._waiting.get(msg_id) if isinstance(msg_id, int) else None
        if waiter is not None and not waiter.done():
            waiter.set_result(message)

    async def _read_stderr(self) -> None:
        stderr = self.proc.stderr
        assert stderr is not None
        with contextlib.suppress(ValueError):
            while raw := await stderr.readline():
                self.log.line(raw.decode("utf-8", "replace").rstrip())
        self.log.flush()

    def _fail_all(self, error: Exception) -> None:
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(error)

    async def close(self) -> None:
        """Close stdin (a server's cue to exit); the owner stops the child."""
        stdin = self.proc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        self._fail_all(McpProtocolError("the link was closed"))
        for task in (self.reader, self._errors):
            task.cancel()
        await asyncio.gather(self.reader, self._errors, return_exceptions=True)


class HttpLink:
    """JSON-RPC over MCP's streamable HTTP: one POST per message."""

    def __init__(self, url: str, key: str | None, on_notice: Notice) -> None:
        self.url, self.on_notice = url, on_notice
        self._ids = itertools.count(1)
        self._session = aiohttp.ClientSession()
        self._headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._session_id: str | None = None

    def _with_session(self) -> dict[str, str]:
        headers = dict(self._headers)
        if self._session_id is not None:
            headers["Mcp-Session-Id"] = self._session_id
            headers["MCP-Protocol-Version"] = mcp.PROTOCOL_VERSION
        return headers

    async def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        msg_id = next(self._ids)
        try:
            async with asyncio.timeout(timeout):
                return mcp.outcome(await self._post(mcp.request(msg_id, method, params), msg_id))
        except TimeoutError:
            raise McpProtocolError(f"{method}: no answer within {timeout:g} s") from None
        except aiohttp.ClientError as exc:
            raise McpProtocolError(f"{method}: {self.url} did not answer ({exc})") from None

    async def notify(self, method: str) -> None:
        try:
            async with asyncio.timeout(10):
                await self._post(mcp.notification(method), None)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise McpProtocolError(f"{method}: {self.url} did not take it ({exc!r})") from None

    async def _post(self, data: bytes, msg_id: int | None) -> dict[str, Any]:
        async with self._session.post(self.url, data=data, headers=self._with_session()) as resp:
            if "Mcp-Session-Id" in resp.headers:
                self._session_id = resp.headers["Mcp-Session-Id"]
            if resp.status >= 400:
                text = (await resp.text())[:300]
                raise McpProtocolError(f"{self.url} answered HTTP {resp.status}: {text}")
            if msg_id is None:
                return {}
            if resp.content_type == "text/event-stream":
                return await self._from_events(resp, msg_id)
            message = mcp.parse(await resp.read())
            return message

    async def _from_events(self, resp: aiohttp.ClientResponse, msg_id: int) -> dict[str, Any]:
        decoder = SSEDecoder()
        async for chunk in resp.content.iter_any():
            for event in decoder.feed(chunk):
                if not isinstance(event.data, dict):
                    continue
                method = event.data.get("method")
                if event.data.get("id") == msg_id and method is None:
                    return event.data
                if isinstance(method, str) and event.data.get("id") is None:
                    self.on_notice(method)
        raise McpProtocolError(f"{self.url} ended its event stream without the answer")

    async def close(self) -> None:
        if self._session_id is not None:  # end the server's session, if it keeps one
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(2):
                    await self._session.delete(self.url, headers=self._with_session())
        await self._session.close()
