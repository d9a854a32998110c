"""Front-door checks every reader and writer of files shares, so that no file, however made,
can hang the kernel, drive its memory far beyond the file's real content, or reach recursive
code nested deeper than any real trace or snapshot is:

- `open_regular` / `check_regular`: a path to read must be a regular file. A FIFO, socket,
  device or directory is refused before anything blocks on it (a FIFO opened for reading
  waits for a writer forever);
- `open_for_writing` / `check_writable`: the same for a path to write (a FIFO opened for
  writing waits for a reader);
- `FileIdentity`: size and modification time of a file when it was read, checked before it
  is read again (`report.save()`, `run.rank(k)`), so a file replaced since is not taken for
  the one analysed;
- `GzipGuard`: decompression that stops once the output grows more than MAX_GZIP_RATIO
  times the compressed bytes read (a gzip bomb), with a clear error;
- `check_nesting`, `loads_json`: nesting depth bounded before any walker recurses;
- `describe` (from model/arguments.py): a short, safe description of any value for an
  error message (a repr of a value nested a million deep, or an int of 10,000 digits, raises).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, NoReturn

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.arguments import describe

__all__ = [
    "FileIdentity",
    "GzipGuard",
    "check_nesting",
    "check_regular",
    "check_writable",
    "describe",
    "loads_json",
    "nesting_depth",
    "open_for_writing",
    "open_regular",
]

# Real traces and snapshots expand 5-30x under gzip (measured on every gzip trace in
# tests/data and ../shared/traces: at most 29.7x). Past this ratio (plus GZIP_SLACK_BYTES,
# so tiny files are never judged) the input is a bomb, not a trace.
MAX_GZIP_RATIO = 50
GZIP_SLACK_BYTES = 16 << 20
# Deeper than any real file nests (a trace event: object > args > list of shapes > shape;
# a snapshot: dict > list > dict > list of frames > frame), with a wide margin.
MAX_NESTING = 32

ErrorType = Callable[[str], GpuprofError]

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def _refuse(path: str, mode: int, what: str, error: ErrorType) -> NoReturn:
    raise error(
        f"{path}: is {_kind(mode)}, not a regular file; refused before opening it (reading "
        f"a pipe or device could wait forever). Pass the path of {what}."
    )


def check_regular(path: str | os.PathLike[str], *, what: str, error: ErrorType) -> os.stat_result:
    """Return the stat of `path` (never opened) when it is a regular file; raise `error`
    naming the path otherwise (missing, a directory, a FIFO, a socket, a device)."""
    where = os.fspath(path)
    try:
        st = os.stat(where)
    except FileNotFoundError:
        raise error(
            f"{where}: cannot open it (no such file or directory); pass the path of {what}."
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or exc
        raise error(f"{where}: cannot read it ({reason}); pass the path of {what}.") from None
    if not stat.S_ISREG(st.st_mode):
        _refuse(where, st.st_mode, what, error)
    return st


def open_regular(
    path: str | os.PathLike[str], *, what: str, error: ErrorType
) -> tuple[BinaryIO, os.stat_result]:
    """Open `path` for binary reading and return (file, its stat); raise `error` unless it
    is a regular file. Opened non-blocking and checked on the open descriptor, so a path
    swapped for a FIFO after a check still cannot block."""
    where = os.fspath(path)
    check_regular(where, what=what, error=error)
    try:
        fd = os.open(where, os.O_RDONLY | _NONBLOCK | _BINARY)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise error(f"{where}: cannot open it ({reason}); pass the path of {what}.") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _refuse(where, st.st_mode, what, error)
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def check_writable(path: str | os.PathLike[str], *, what: str, error: ErrorType) -> str:
    """Return `path` as a string when a file may be written there: it does not exist yet,
    or is a regular file. A FIFO, socket, device or directory is refused (writing to a FIFO
    waits for a reader forever), and so is a parent that is not a directory."""
    where = os.fspath(path)
    if not where or "\x00" in where:
        raise error(f"{where!r}: not a usable file name; pass the path to write {what} to.")
    try:
        st = os.stat(where)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(where))
        # The parent is created by the writers that create it; an existing one must be a
        # directory.
        while parent and not os.path.exists(parent):
            up = os.path.dirname(parent)
            if up == parent:
                break
            parent = up
        if parent and os.path.exists(parent) and not os.path.isdir(parent):
            raise error(
                f"{where}: {parent} is not a directory; pass a path in a folder for {what}."
            ) from None
        return where
    except OSError as exc:
        raise error(f"{where}: cannot write there ({exc.strerror or exc}).") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(
            f"{where}: is {_kind(st.st_mode)}, not a regular file; refused before writing "
            f"(a pipe or device could wait forever). Pass a file path for {what}."
        )
    return where


def open_for_writing(path: str | os.PathLike[str], *, what: str, error: ErrorType) -> BinaryIO:
    """Open `path` for binary writing (created or truncated), refusing anything but a
    regular file on the open descriptor (see check_writable)."""
    where = check_writable(path, what=what, error=error)
    try:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NONBLOCK | _BINARY, 0o666)
    except OSError as exc:
        raise error(f"{where}: cannot write {what} there ({exc.strerror or exc}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{where}: is {_kind(st.st_mode)}, not a regular file; nothing written.")
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """A file as it was when read: its path, size and modification time (nanoseconds)."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str, st: os.stat_result) -> FileIdentity:
        return cls(path, st.st_size, st.st_mtime_ns)

    def check(self, *, what: str, error: ErrorType) -> None:
        """Raise `error` when the file is gone, or no longer the one read (another size or
        modification time): re-reading it would analyse or copy different content."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise error(
                f"{self.path}: {what} was loaded from this file, which cannot be read any "
                f"more ({exc.strerror or exc})."
            ) from None
        if not stat.S_ISREG(st.st_mode) or (st.st_size, st.st_mtime_ns) != (
            self.size,
            self.mtime_ns,
        ):
            raise error(
                f"{self.path}: the file changed since {what} was loaded from it (size "
                f"{self.size:,} -> {st.st_size:,} bytes, or a newer modification time); "
                "load it again to use the new content."
            )


class _Counting:
    """A raw file that counts the bytes read from it (what GzipGuard compares with)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.count += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        self.count += n or 0
        return n or 0

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed


class GzipGuard:
    """Reads a gzip stream (`opener(fileobj=...)`, a GzipFile class) and raises `error` once
    its output exceeds MAX_GZIP_RATIO times the compressed bytes read so far, plus
    GZIP_SLACK_BYTES: memory and time stay bounded by the file's real size."""

    def __init__(
        self, raw: IO[bytes], opener: Callable[..., Any], where: str, error: ErrorType
    ) -> None:
        self._raw = _Counting(raw)
        self._gz = opener(fileobj=self._raw, mode="rb")
        self._where = where
        self._error = error
        self.out = 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts: list[bytes] = []
            while True:
                part = self.read(1 << 20)
                if not part:
                    return b"".join(parts)
                parts.append(part)
        data: bytes = self._gz.read(n)
        self.out += len(data)
        if self.out > MAX_GZIP_RATIO * self._raw.count + GZIP_SLACK_BYTES:
            raise self._error(
                f"{self._where}: the gzip data expands more than {MAX_GZIP_RATIO}x (over "
                f"{self.out / 2**20:,.0f} MB from {self._raw.count / 2**20:,.1f} MB read): a "
                "gzip bomb, or padding. Real traces and snapshots expand 5-30x. If this is a "
                "real file, decompress it yourself (gunzip) and load the uncompressed file."
            )
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readline(self, limit: int = -1) -> bytes:  # the unpickler's text opcodes
        line: bytes = self._gz.readline(limit if limit and limit > 0 else 1 << 20)
        self.out += len(line)
        return line

    def peek(self, n: int = 0) -> bytes:
        data: bytes = self._gz.peek(n)
        return data

    def tell(self) -> int:
        return self.out

    def close(self) -> None:
        self._gz.close()


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """Return how deep lists, tuples and dicts nest in `value` (a scalar is 0), or
    `limit + 1` as soon as it is known to be deeper than `limit`. Iterative, and stops at
    the limit, so a value nested a million deep costs `limit` steps per branch, and each
    container is visited once (shared ones too)."""
    deepest = 0
    # id -> the deepest level the container was met at: met again deeper, it is walked
    # again (at most `limit` times), so sharing cannot hide depth.
    seen: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict, set, frozenset)):
            depth += 1
            if depth > limit:
                return limit + 1
            if seen.get(id(item), 0) >= depth:
                continue
            seen[id(item)] = depth
            deepest = max(deepest, depth)
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item if isinstance(k, tuple))
                stack.extend((v, depth) for v in item.values())
            else:
                stack.extend((v, depth) for v in item)
    return deepest


def check_nesting(value: Any, where: str, error: ErrorType, limit: int = MAX_NESTING) -> None:
    """Raise `error` when `value` nests deeper than `limit` levels."""
    if nesting_depth(value, limit) > limit:
        raise error(
            f"{where}: nested more than {limit} levels deep; no real file nests so deep "
            "(a damaged or crafted file). Refused."
        )


def loads_json(text: str | bytes, where: str, error: ErrorType, limit: int = MAX_NESTING) -> Any:
    """Return the value of a small JSON document (a ladder report, the ceilings cache),
    with its nesting bounded (see check_nesting) and every decoding failure as `error`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{where}: not readable JSON (nested too deep).") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not JSON ({exc.msg} at line {exc.lineno}).") from None
    except (ValueError, UnicodeDecodeError) as exc:  # an integer of over 4300 digits, bad UTF-8
        raise error(f"{where}: not readable JSON ({str(exc)[:200]}).") from None
    check_nesting(value, where, error, limit)
    return value
