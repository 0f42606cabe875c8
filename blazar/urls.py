"""URLs a client or a manifest named, checked as the connector will see them.

Every place Blazar fetches a URL it did not write itself passes it through `target`
first and requests `Target.url`, never the text it was given: an image URL in a chat
request (`blazar.serve.request.images`, on every redirect hop), a remote's base URL
(`blazar.serve.state.remotes`), an MCP server's url (`blazar.serve.supervisor.mcp_link`),
a download (`blazar.engines.download`: https sources, release assets, fork archives),
the release feed, the engine catalog, an http(s) git URL of a fork or source build, and
the Hugging Face endpoint (`blazar.sources.hf`).

Why: the text a check reads and the host a connector dials can differ. `urlsplit`
leaves `１２７.０.０.１` (full-width digits) as written, so it is not an IP literal and
a check leaves it to the resolver; yarl, under aiohttp, normalises the host (IDNA/UTS46,
which includes NFKC) to `127.0.0.1`, and aiohttp connects to IP literals without asking
the resolver. `urllib` does the same through Python's `idna` codec. Numeric forms that
`inet_aton` accepts (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`) reach an address a
dotted-quad check never saw. So `target` parses with yarl, as the connector will, and
refuses any host whose normalised form differs in kind from what was written:

- a host written with non-ASCII characters that normalises to an address, to a
  number, or to a label that is plain ASCII (`１２７.０.０.１`, `127。0。0。1`,
  `12７.0.0.1`, `١٢٧.٠.٠.١`, `ｌｏｃａｌｈｏｓｔ`); a genuine internationalised name
  (`bücher.de`, sent as `xn--bcher-kva.de`) passes;
- an IPv4 address in any form but the canonical dotted quad (decimal, hex, octal,
  short forms, leading zeros, a trailing dot): a host whose last label is a number is
  an address, as browsers and `inet_aton` read it;
- brackets around anything but a plain IPv6 address (no zone id, no IPvFuture);
- a host with characters no resolver takes (`%`, spaces, empty labels);
- userinfo, unless the caller allows credentials (a manifest's URL may carry them; a
  client's image URL may not).

Whether an address may be reached is a separate, pure policy (`address_refusal`):
private, loopback, link-local, shared, multicast, reserved and unspecified addresses
(IPv4-mapped, NAT64 and 6to4 forms decided by the IPv4 address inside) are refused
unless listed. The gateway applies it to client-named URLs only: to an IP literal
before connecting, to a name once its connection's resolver has resolved it. A
manifest's URLs may name private addresses (the operator chose them).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

import yarl

from blazar.errors import InvalidInput

__all__ = ["WEB", "RefusedUrl", "Target", "address_refusal", "target"]

WEB = ("http", "https")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# A host name as resolvers take it, lowercase (yarl lowers ASCII hosts): labels of
# letters, digits, `-` and `_` (compose and k8s service names use it), one optional
# trailing dot (a fully qualified name).
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")
# What WHATWG URL parsing and `inet_aton` read as a number: decimal, 0x-hex, 0-octal.
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHOWN = 200  # characters of a refused URL quoted back


class RefusedUrl(InvalidInput):
    """A URL Blazar will not fetch: not a URL, or its host reads differently to the
    connector than to a person (the message says which and how to write it)."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"{url[:_SHOWN]!r} {why}")
        self.url = url
        self.why = why


@dataclass(frozen=True)
class Target:
    """Where a connection for a URL goes: the parts as the connector uses them."""

    scheme: str
    host: str  # ASCII, as dialled or resolved: IDNA-encoded name, or the address
    port: int
    address: Address | None  # the host when it is an IP literal (None: a name to resolve)
    url: str  # the URL to request, built from these parts (no fragment)

    @property
    def is_ip(self) -> bool:
        return self.address is not None


def target(url: str, *, schemes: Collection[str] = WEB, credentials: bool = False) -> Target:
    """The connection `url` makes, or RefusedUrl saying why Blazar will not make it: the
    scheme must be one of `schemes`, the host must read the same to a person, to this
    check and to the connector (module docstring), and userinfo is refused unless
    `credentials`. Pure: no resolution, no policy on addresses (`address_refusal`)."""
    if not isinstance(url, str) or _CONTROL.search(url):
        raise RefusedUrl(str(url), "is not a URL: it holds control characters")
    try:
        parsed = yarl.URL(url)
        port = parsed.port
    except Exception:  # ValueError mostly; IndexError for `http://[]@/`: never a 500
        raise RefusedUrl(url, "is not a URL") from None
    scheme = parsed.scheme
    if scheme not in schemes:
        raise RefusedUrl(url, f"is not an {' or '.join(sorted(schemes))} URL")
    host = parsed.raw_host
    parts, userinfo, written, port_text = _split(url)
    if not host or not written:
        raise RefusedUrl(url, "names no host")
    if (parsed.user is not None or parsed.password is not None) and not credentials:
        raise RefusedUrl(url, "carries credentials (user:password@); none may be sent")
    if port is None:
        raise RefusedUrl(url, f"has no port and {scheme} has no default one")
    why = _host_refusal(written, host)
    if why is not None:
        raise RefusedUrl(url, why)
    address = ipaddress.ip_address(host) if written.startswith("[") or _is_numeric(host) else None
    # The normalised host in the URL as written otherwise: its path and query go as the
    # caller wrote them (re-serialising through yarl would decode `%2F` in a signed query).
    dialled = f"[{host}]" if address is not None and address.version == 6 else host
    netloc = (
        (f"{userinfo}@" if userinfo else "") + dialled + (port_text if port_text != ":" else "")
    )
    sent = urlunsplit((scheme, netloc, parts.path, parts.query, ""))
    return Target(scheme, host, port, address, sent)


def _split(url: str) -> tuple[SplitResult, str, str, str]:
    """The URL's parts, its userinfo, its host and `:port` as written, by the same split of
    the authority as yarl's (`urlsplit`); the port must be ASCII digits."""
    try:
        parts = urlsplit(url)
    except ValueError:  # brackets around what is not an address, say
        raise RefusedUrl(url, "is not a URL") from None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if hostport.startswith("["):
        end = hostport.find("]")
        host, port = hostport[: end + 1], hostport[end + 1 :]
    else:
        host, colon, digits = hostport.partition(":")
        port = colon + digits
    if port and not re.fullmatch(r":[0-9]*", port):  # full-width digits, say
        raise RefusedUrl(url, "has a port written with other than ASCII digits")
    return parts, userinfo, host, port


def _host_refusal(written: str, host: str) -> str | None:
    """Why `written` (the host as in the URL) and `host` (as yarl normalised it, what
    aiohttp dials) are not the same kind of host; None when they are."""
    if written.startswith("["):
        inner = written[1:-1]
        try:
            ok = inner.isascii() and "%" not in inner and ipaddress.IPv6Address(inner)
        except ValueError:
            ok = False
        if not ok:
            return f"has brackets around {written[:80]!r}, which is not a plain IPv6 address"
        return None
    shown = f"its host {written[:80]!r}"
    if not _NAME.fullmatch(host):
        return f"is not a URL Blazar fetches: {shown} is not a host name or an address"
    if not written.isascii():
        digits = _fold("".join(str(unicodedata.decimal(c, "")) or c for c in written))
        if _is_numeric(host) or _is_numeric(digits):
            reads = host if _is_numeric(host) else digits
            return (
                f"is refused: {shown} is written with non-ASCII characters and reads as the "
                f"address {reads.rstrip('.')!r}: write the address in ASCII digits and dots"
            )
        labels, encoded = _labels(written), host.split(".")
        if len(labels) != len(encoded) or any(
            label.lower() != out
            if label.isascii()
            else _fold(label).isascii() or not out.startswith("xn--")
            for label, out in zip(labels, encoded, strict=True)
        ):
            return (
                f"is refused: {shown} is written with non-ASCII characters that stand "
                f"for the ASCII name {host!r}: write that name in ASCII"
            )
        return None
    if _is_numeric(host) and not _canonical_ipv4(host):
        return (
            f"is refused: {shown} is an IPv4 address in a form resolvers read differently: "
            "write it as four decimal numbers without leading zeros, such as 192.0.2.1"
        )
    if host != written.lower():
        return f"is refused: {shown} is connected to as {host!r}: write that instead"
    return None


def _fold(text: str) -> str:
    """NFKC with the ideographic full stop as a dot: what UTS46 does to dots and digits."""
    return unicodedata.normalize("NFKC", text).replace("\u3002", ".")


def _labels(written: str) -> list[str]:
    """The labels of a host as written, split at every character UTS46 reads as a dot."""
    out, label = [], ""
    for c in written:
        if _fold(c) == ".":
            out.append(label)
            label = ""
        else:
            label += c
    return [*out, label]


def _is_numeric(host: str) -> bool:
    """Whether a host is an address to a URL parser or `inet_aton`: an IPv6 literal, or
    a last label (before one trailing dot) that is a number."""
    if ":" in host:
        return True
    last = host.removesuffix(".").rpartition(".")[2]
    return bool(_NUMBER.fullmatch(last))


def _canonical_ipv4(host: str) -> bool:
    """Four decimal octets, no leading zero, no trailing dot: the one form every
    parser reads as the same address."""
    octets = host.split(".")
    return len(octets) == 4 and all(
        re.fullmatch(r"0|[1-9][0-9]{0,2}", o) and int(o) < 256 for o in octets
    )


# -- the policy for client-named URLs ---------------------------------------------------------


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, NAT64 or 6to4 address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in ipaddress.ip_network("64:ff9b::/96"):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def address_refusal(address: str, networks: Sequence[Any] = ()) -> str | None:
    """Why a client-named URL may not reach `address` (None: it may): not a public
    address, and not in the allowed `networks`. An address with an IPv4 address inside
    is decided by that one."""
    ip = ipaddress.ip_address(address.split("%")[0])  # an IPv6 zone id
    if any(ip.version == n.version and ip in n for n in networks):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and (inner := _embedded_v4(ip)) is not None:
        return address_refusal(str(inner), networks)
    for what, test in (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if test:
            return f"{what} address {ip}"
    if not ip.is_global:  # 100.64.0.0/10 (carrier-grade NAT) and the like
        return f"non-public address {ip}"
    return None
