"""HTTP downloads that a hostile or broken server cannot turn against the user.

A download fills `<file>.part` and resumes it with a Range request. Whatever the server does, it
ends in one line and never harms anything beyond that file:

- a size cap (`Limits.max_bytes`): an endless stream or an oversized Content-Length stops there;
- a stall rule and a deadline: fewer than `MIN_PROGRESS` bytes in any `stall_seconds` (a trickle
  of one byte every few seconds resets no socket timeout) or a download older than
  `deadline_seconds` stops;
- redirects only to the publisher's hosts (`Limits.hosts`), at most `max_redirects` of them;
- the partial file is opened without following a link (a `.part` planted as a symlink to a file
  elsewhere is refused, not appended to).
"""

from __future__ import annotations

import http.client
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from advbench.core.errors import AdvbenchError

CHUNK = 1 << 20
MIN_PROGRESS = 64 << 10
"""Bytes that must arrive in every stall window for a download to count as moving."""
MAX_DOWNLOAD_BYTES = 2 << 30
"""The cap for a file whose size the catalogue does not give (the largest published metric file is ~0.5 GB)."""
SIZE_SLACK = 1.05
"""A catalogued size may be rounded: the cap is this much above it (plus one chunk)."""
STALL_SECONDS = 30.0
"""The stall window: fewer than MIN_PROGRESS bytes in it (or silence) stops a download."""
DEADLINE_SECONDS = 3600.0
"""No download may take longer (a 0.5 GB file at the stall rule's floor of ~2 kB/s would not)."""
MAX_REDIRECTS = 5


@dataclass(frozen=True)
class Limits:
    """What one download may do: its size, its pace, and where it may be redirected."""

    hosts: frozenset[str]
    max_bytes: int
    stall_seconds: float
    deadline_seconds: float
    max_redirects: int

    @classmethod
    def for_size(cls, hosts: frozenset[str], size_bytes: float | None) -> Limits:
        """The module's limits for a file of `size_bytes` (None: unknown, capped at MAX_DOWNLOAD_BYTES)."""
        cap = MAX_DOWNLOAD_BYTES if not size_bytes else int(size_bytes * SIZE_SLACK) + CHUNK
        return cls(hosts, cap, STALL_SECONDS, DEADLINE_SECONDS, MAX_REDIRECTS)


def check_url(url: str, what: str) -> str:
    """An http(s) URL with a host, else a one-line error naming `what` it was meant to be."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AdvbenchError(f"{what} must be an http:// or https:// URL with a host, got {url!r}")
    return url


def _opener(url: str, limits: Limits) -> urllib.request.OpenerDirector:
    class Redirects(urllib.request.HTTPRedirectHandler):
        max_redirections = limits.max_redirects

        def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 - urllib's signature
            host = urlsplit(newurl).hostname
            if host not in limits.hosts:
                raise AdvbenchError(f"{url}: the server redirected to {host}, which is not among the publisher's "
                                    f"hosts ({', '.join(sorted(limits.hosts))}); refused")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return urllib.request.build_opener(Redirects)


def _open(url: str, offset: int, limits: Limits) -> http.client.HTTPResponse:
    request = urllib.request.Request(url, headers={"User-Agent": "advbench"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        return _opener(url, limits).open(request, timeout=limits.stall_seconds)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the partial file is already complete
            raise
        if 300 <= exc.code < 400:
            raise AdvbenchError(f"{url}: more than {limits.max_redirects} redirects or a redirect loop; refused") from None
        raise AdvbenchError(f"{url}: the server answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, socket.timeout, ConnectionError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise AdvbenchError(f"cannot reach {urlsplit(url).netloc}: {reason}; "
                            f"fetch it where there is a network and copy the file, or pass --mirror URL") from None


def open_no_follow(path: Path, append: bool) -> int:
    """A file descriptor for writing `path` itself: a symlink there is an error, never followed."""
    if path.is_symlink():
        raise AdvbenchError(f"'{path}' is a symbolic link; advbench writes only regular files there: remove it")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        raise AdvbenchError(f"cannot write '{path}': {exc.strerror or exc}") from None


def download(url: str, part: Path, progress: Callable[[int, int | None], None], limits: Limits) -> None:
    """Fill `part` with the file at `url`, continuing an earlier partial download.

    `progress(done, total)` is called as bytes arrive. A server that ignores Range restarts the
    file from zero; a connection that drops leaves `part` for the next call to resume; a
    download that breaks a limit is deleted.
    """
    if part.is_symlink():  # before any request: nothing is sent, nothing written through the link
        raise AdvbenchError(f"'{part}' is a symbolic link; advbench writes only regular files there: remove it")
    offset = part.stat().st_size if part.is_file() else 0
    try:
        response = _open(url, offset, limits)
    except urllib.error.HTTPError:
        return  # 416: nothing left to fetch
    with response:
        if "text/html" in (response.headers.get("Content-Type") or ""):
            raise AdvbenchError(f"{url} sent a web page, not the file: download it in a browser")
        resumed = offset > 0 and response.status == 206
        offset = offset if resumed else 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None and length.isdigit() else None
        if total is not None and total > limits.max_bytes:
            raise AdvbenchError(f"{url} announces {total / 1e6:.1f} MB, more than the {limits.max_bytes / 1e6:.1f} MB "
                                "this file may have; refused")
        progress(offset, total)
        with os.fdopen(open_no_follow(part, resumed), "ab" if resumed else "wb") as out:
            done = _copy(url, response, out, offset, total, progress, limits, part)
    if total is not None and done < total:
        raise AdvbenchError(f"download of {url} stopped after {done / 1e6:.1f} of {total / 1e6:.1f} MB; "
                            f"run the same command again to resume")


def _copy(url: str, response: http.client.HTTPResponse, out: object, done: int, total: int | None,
          progress: Callable[[int, int | None], None], limits: Limits, part: Path) -> int:
    """Copy the body into `out` under the limits; the bytes in the file when it ends."""
    start = window = time.monotonic()
    window_bytes = 0
    try:
        while block := response.read1(CHUNK):
            out.write(block)  # type: ignore[attr-defined]
            done += len(block)
            window_bytes += len(block)
            progress(done, total)
            now = time.monotonic()
            if done > limits.max_bytes:
                _stop(part, f"{url} sent more than the {limits.max_bytes / 1e6:.1f} MB this file may have")
            if now - start > limits.deadline_seconds:
                _stop(part, f"download of {url} took longer than {limits.deadline_seconds:g} s")
            if now - window >= limits.stall_seconds:
                if window_bytes < MIN_PROGRESS and (total is None or done < total):
                    _stop(part, f"download of {url} stalled: {window_bytes} bytes in {now - window:.0f} s")
                window, window_bytes = now, 0
    except (http.client.IncompleteRead, ConnectionError, socket.timeout, urllib.error.URLError) as exc:
        raise AdvbenchError(f"download of {url} stopped after {done / 1e6:.1f} MB ({type(exc).__name__}); "
                            f"run the same command again to resume") from None
    return done


def _stop(part: Path, why: str) -> None:
    part.unlink(missing_ok=True)
    raise AdvbenchError(f"{why}; stopped and the partial file deleted")
