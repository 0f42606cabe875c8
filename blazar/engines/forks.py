"""Installing a fork lane: fetch exactly the pinned commit, verify it, build it like `engine build`.

`blazar engine install --lane ID` and the engines port (a manifest's
`[engines.NAME] lane = "ID"`) call `install_offer`. The source is fetched by
git over the offer's URL (any URL git takes, `file://` included), checked out
at the pinned commit, and verified twice: HEAD must be that full commit and
its tree must hash to the offer's `tree`; or, for an offer with an `archive`,
the download must match its sha256. Anything else is refused before a build
starts. The build is `blazar.engines.source.build_source`, the path of `engine
build` (cmake, CUDA architectures and host compiler detected), into the lane's
own directory under a tag that names the commit: `fork-ID-<short sha>-cpu`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from blazar import urls
from blazar.engines.base import InstalledEngine
from blazar.engines.catalog import Offer
from blazar.engines.source import BACKENDS, Runner, SourceBuildError, build_source
from blazar.errors import InvalidInput, VerificationFailed


class OfferMismatch(VerificationFailed):
    """The fetched source is not what the catalog pins."""


def _git(runner: Runner, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = ["git", *(["-C", str(cwd)] if cwd else []), *args]
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        return runner(cmd, capture_output=True, text=True, env=env)
    except FileNotFoundError:
        raise SourceBuildError("git is not installed: install it and try again") from None


def fetch_git(offer: Offer, into: Path, runner: Runner = subprocess.run) -> Path:
    """A checkout of exactly `offer.commit`, verified against its tree hash."""
    repo = offer.repo
    if repo.partition("://")[0].lower() in urls.WEB:  # git dials the host as yarl reads it
        repo = urls.target(repo, credentials=True).url
    into.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix=f"fork-{offer.id}-", dir=into))
    _git(runner, "init", "--quiet", str(dest))
    # By SHA first (git's protocol v2 serves any reachable commit); a server that refuses
    # that gets a full fetch, and the commit is checked out from it.
    done = _git(runner, "fetch", "--quiet", "--depth", "1", repo, offer.commit, cwd=dest)
    target = "FETCH_HEAD"
    if done.returncode != 0:
        done = _git(runner, "fetch", "--quiet", repo, "+refs/*:refs/fetched/*", cwd=dest)
        target = offer.commit
    if done.returncode != 0:
        said = (done.stderr or "").strip().splitlines() or ["git failed"]
        raise SourceBuildError(
            f"cannot fetch commit {offer.commit} of {offer.repo} (offer {offer.id!r}): "
            f"{said[-1]}; check that the repository is reachable and has that commit"
        )
    done = _git(runner, "checkout", "--quiet", "--detach", target, cwd=dest)
    if done.returncode != 0:
        raise OfferMismatch(
            f"offer {offer.id!r}: {offer.repo} has no commit {offer.commit}; refusing to build"
        )
    head = (_git(runner, "rev-parse", "HEAD", cwd=dest).stdout or "").strip()
    tree = (_git(runner, "rev-parse", "HEAD^{tree}", cwd=dest).stdout or "").strip()
    if head != offer.commit:
        raise OfferMismatch(
            f"offer {offer.id!r}: {offer.repo} gave commit {head or '?'} for {offer.commit}; "
            "refusing to build it"
        )
    if tree != offer.tree:
        raise OfferMismatch(
            f"offer {offer.id!r}: the source fetched from {offer.repo} at {offer.short} does "
            f"not match its digest (tree {tree or '?'}, the catalog says {offer.tree}); "
            "refusing to build it: fix the catalog entry or its repository"
        )
    return dest


def fetch_archive(offer: Offer, into: Path, downloads: Path) -> Path:
    """The offer's archive, verified against its sha256 and unpacked."""
    from blazar.engines.download import download, unpack

    assert offer.archive is not None and offer.sha256 is not None
    name = f"fork-{offer.id}-{offer.short}" + "".join(Path(offer.archive).suffixes[-2:])
    archive = downloads / name
    try:
        if offer.archive.startswith("file://"):
            local = Path(offer.archive.removeprefix("file://"))
            from blazar.models.hashing import sha256_file

            if sha256_file(local)[0] != offer.sha256:
                raise VerificationFailed("sha256 mismatch")
            archive = local
        else:
            downloads.mkdir(parents=True, exist_ok=True)
            download(offer.archive, archive, sha256=offer.sha256)
    except VerificationFailed:
        raise OfferMismatch(
            f"offer {offer.id!r}: the archive {offer.archive} does not match its digest "
            f"(sha256 {offer.sha256}); refusing to build it"
        ) from None
    into.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix=f"fork-{offer.id}-", dir=into))
    unpack(archive, dest)
    return dest


def install_offer(
    offer: Offer,
    backend: str,
    engines_root: Path,
    *,
    work_dir: Path,
    downloads: Path,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    runner: Runner = subprocess.run,
) -> InstalledEngine:
    """Fetch, verify and build `offer` for `backend` as an engine of lane `offer.id`."""
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend not in offer.backends:
        raise InvalidInput(
            f"offer {offer.id!r} builds for {', '.join(offer.backends)}, not {backend}: "
            f"`blazar engine install --lane {offer.id} --backend {offer.backends[0]}`"
        )
    say = log or (lambda _msg: None)
    say(f"fetching {offer.repo} at {offer.commit} (offer {offer.id}) ...")
    if offer.tree is not None:
        tree = fetch_git(offer, work_dir, runner)
    else:
        tree = fetch_archive(offer, work_dir, downloads)
    say(f"verified {offer.digest}; building ...")
    try:
        built = build_source(
            engines_root,
            str(tree),
            backend,
            work_dir=work_dir,
            jobs=jobs,
            log=say,
            runner=runner,
            extra=offer.build_options,
            lane=offer.id,
            tag=offer.tag(backend),
        )
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    details = {**built.details, "source": f"{offer.repo}@{offer.commit}", "offer": offer.id}
    return InstalledEngine(
        kind=built.kind,
        tag=built.tag,
        method="fork",
        version=offer.commit,
        path=built.path,
        command=built.command,
        details=details,
    )
