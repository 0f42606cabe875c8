"""The async-job routes the audio and images APIs share: list, read and cancel the jobs a
key may see (with keys in use, a key sees only its own; `JobTable.owned/visible`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.serve.http import KEY_NAME
from blazar.serve.request.grants import grant_of


class _Job(Protocol):
    def to_api(self) -> dict[str, Any]: ...


class Jobs(Protocol):
    """What the routes need of a job table (`AudioJobs`, `ImageJobs`)."""

    def get(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> _Job: ...

    def visible(self, key: str | None = None, *, keyed: bool = False) -> Sequence[_Job]: ...

    async def cancel(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> _Job: ...


J = TypeVar("J", bound=Jobs)


class JobRoutes(Generic[J]):
    """`GET .../jobs`, `GET .../jobs/{id}`, `POST .../jobs/{id}/cancel` for one API."""

    noun: ClassVar[str]  # "audio", "image": what the 501 without serve names
    jobs: J | None = None

    def _jobs(self) -> J:
        if self.jobs is None:
            raise ProtocolError(
                501, f"async {self.noun} jobs need `blazar serve`", "not_implemented"
            )
        return self.jobs

    @staticmethod
    def _who(request: web.Request) -> tuple[str | None, bool]:
        """(the key's name, whether keys are in use): a key sees only its own jobs."""
        return request.get(KEY_NAME), grant_of(request) is not None

    async def list_jobs(self, request: web.Request) -> web.Response:
        key, keyed = self._who(request)
        jobs = [j.to_api() for j in self._jobs().visible(key, keyed=keyed)]
        return web.json_response({"object": "list", "data": jobs})

    async def job(self, request: web.Request) -> web.Response:
        key, keyed = self._who(request)
        found = self._jobs().get(request.match_info["id"], key, keyed=keyed)
        return web.json_response(found.to_api())

    async def cancel(self, request: web.Request) -> web.Response:
        key, keyed = self._who(request)
        found = await self._jobs().cancel(request.match_info["id"], key, keyed=keyed)
        return web.json_response(found.to_api())
