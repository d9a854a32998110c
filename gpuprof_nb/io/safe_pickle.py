"""Unpickling a memory snapshot without trusting it: a scan of every opcode first, then the
C unpickler with every class and function refused.

A pickle is a program for a small stack machine, and the C unpickler runs it as told. Told
by a crafted file, it would allocate what the file claims rather than what it holds (a
24-byte file whose memo index is 2**28 makes it zero 4 GB; a length of 2**63 overflows),
and a tuple nested a million deep, once used as a dict key, overflows the C stack while it
is hashed (a segfault: the kernel dies). So `scan` reads every opcode before anything is
built, and refuses:

- any opcode that names a class or function, or refers to a persistent object or an
  out-of-band buffer (a snapshot is plain dicts, lists, strings and numbers);
- a length, frame size or memo index beyond what the file itself holds;
- integers longer than 64 bytes (torch writes 64-bit ones) and text integers of more
  than a few thousand digits;
- anything that is not a pickle opcode, and a file that ends before its STOP.

It also counts the opcodes that build tuples: only they can nest a tuple, so the count
bounds how deep a hash can recurse. Past SAFE_TUPLES, the unpickler runs on a thread whose
stack is sized for that depth (what is deeper is refused afterwards by the readers, which
check every value's type before hashing or printing it).

The scan is one regular expression over runs of fixed-size opcodes (most of a snapshot),
with a Python step only for strings, frames and the rarer opcodes: a fraction of the time
of the unpickling itself (benchmarks/RESULTS.md, "Measurements behind design choices", M21;
section 4 times the whole load against `pickle.load`).
"""

from __future__ import annotations

import io
import pickle
import re
import sys
import threading
import zlib
from collections.abc import Callable
from typing import Any

from gpuprof_nb.errors import SnapshotFormatError

# Tuples the C stack holds while hashing, whatever thread unpickles (about 50 bytes of C
# stack per level; a macOS thread has 512 KiB).
SAFE_TUPLES = 5_000
# Past this many tuple opcodes a file is refused: a snapshot torch writes holds one tuple
# per segment (its pool id), and no device holds this many segments.
MAX_TUPLES = 4_000_000
_STACK_PER_TUPLE = 96
# torch writes 64-bit integers; LONG1 holds up to 255 bytes, LONG4 more.
_MAX_LONG_BYTES = 64
_MAX_TEXT_DIGITS = 4_000

# Runs of opcodes of fixed size that build nothing dangerous: no-argument opcodes (MARK,
# empty containers, SETITEM(S), APPEND(S), NONE, booleans, MEMOIZE, POP, POP_MARK, DUP,
# LIST, DICT, EMPTY_SET, ADDITEMS, FROZENSET), memo gets and short puts, fixed-size ints
# and floats, and LONG1 integers of up to 9 bytes. The common ones come first. Possessive
# where Python has it (3.11): several times faster, as nothing is kept for backtracking
# (benchmarks/RESULTS.md, "Measurements behind design choices", M21).
_LONG1 = rb"\x8a(?:\x00|\x01.|\x02..|\x03...|\x04.{4}|\x05.{5}|\x06.{6}|\x07.{7}|\x08.{8}|\x09.{9})"
_RUN_BODY = (
    rb"h.|[(})\]uesaN\x88\x89\x94012ld\x8f\x90\x91]|[qK].|[Jj]....|"
    + _LONG1
    + rb"|M..|G.{8}|r..[\x00-\x0f]\x00"
)
_RUN = re.compile(
    rb"(?:" + _RUN_BODY + (rb")*+" if sys.version_info >= (3, 11) else rb")*"), re.DOTALL
)

_REFUSED = {
    ord("c"): "GLOBAL (names a class or function)",
    0x93: "STACK_GLOBAL (names a class or function)",
    ord("R"): "REDUCE (calls a function)",
    ord("b"): "BUILD (sets an object's state)",
    ord("i"): "INST (builds an object of a class)",
    ord("o"): "OBJ (builds an object of a class)",
    0x81: "NEWOBJ (builds an object of a class)",
    0x92: "NEWOBJ_EX (builds an object of a class)",
    0x82: "EXT1 (names a registered class)",
    0x83: "EXT2 (names a registered class)",
    0x84: "EXT4 (names a registered class)",
    ord("P"): "PERSID (a persistent object)",
    ord("Q"): "BINPERSID (a persistent object)",
    0x97: "NEXT_BUFFER (an out-of-band buffer)",
    0x98: "READONLY_BUFFER (an out-of-band buffer)",
}
_TUPLES = frozenset((ord("t"), 0x85, 0x86, 0x87))
# Opcode -> (bytes of its length field, signed): strings and bytes.
_SIZED = {
    0x8C: (1, False),  # SHORT_BINUNICODE
    ord("X"): (4, False),  # BINUNICODE
    0x8D: (8, False),  # BINUNICODE8
    ord("C"): (1, False),  # SHORT_BINBYTES
    ord("B"): (4, False),  # BINBYTES
    0x8E: (8, False),  # BINBYTES8
    0x96: (8, False),  # BYTEARRAY8
    ord("U"): (1, False),  # SHORT_BINSTRING
    ord("T"): (4, True),  # BINSTRING
    0x8A: (1, False),  # LONG1 (longer than the run pattern takes)
    0x8B: (4, True),  # LONG4
}
_STRINGS = frozenset((0x8C, ord("X"), 0x8D))
# Opcodes whose argument is a line of text.
_LINES = frozenset(map(ord, "ILFSVgp"))
# Opcode -> size of its fixed argument, where the run pattern did not take it (a memo
# index past what the pattern accepts, or a file cut inside the argument).
_FIXED = {
    ord("h"): 1,
    ord("q"): 1,
    ord("K"): 1,
    ord("M"): 2,
    ord("J"): 4,
    ord("j"): 4,
    ord("r"): 4,
    ord("G"): 8,
}
_PROTO, _FRAME, _STOP, _LONG_BINPUT, _PUT = 0x80, 0x95, ord("."), ord("r"), ord("p")
_LONGS = (0x8A, 0x8B)


def _damaged(where: str, what: str) -> SnapshotFormatError:
    return SnapshotFormatError(
        f"{where}: {what}; refused before unpickling. A memory snapshot is a plain pickle of "
        "dicts, lists, strings and numbers: this file is damaged or was crafted. Dump it "
        "again with torch.cuda.memory._dump_snapshot(path)."
    )


def scan(data: Any, where: str) -> int:
    """Check every opcode of the pickle in `data` (bytes or an mmap) as the module
    docstring says; return how many opcodes build tuples. Raises SnapshotFormatError.

    Strings and tuples (the opcodes the run pattern leaves most often) are checked here;
    the rarer ones by the helpers below, one per kind of argument."""
    n = len(data)
    memo_limit = max(1 << 20, n // 2)
    run = _RUN.match
    pos = 0
    tuples = 0
    recent = [b"?", b"?"]  # the last two strings: what a STACK_GLOBAL would name
    while True:
        pos = run(data, pos).end()  # type: ignore[union-attr]
        if pos >= n:
            raise SnapshotFormatError(
                f"{where}: the pickle ends without its STOP opcode (a truncated file? an "
                "interrupted copy or dump); dump it again with "
                "torch.cuda.memory._dump_snapshot(path)."
            )
        op = data[pos]
        if op in _SIZED:
            width, signed = _SIZED[op]
            if pos + 1 + width > n:
                raise _damaged(where, f"the file ends inside the opcode at byte {pos:,}")
            size = int.from_bytes(data[pos + 1 : pos + 1 + width], "little", signed=signed)
            start = pos + 1 + width
            if size < 0 or size > n - start:
                raise _damaged(
                    where,
                    f"the opcode at byte {pos:,} declares {size:,} bytes, but the file holds "
                    f"{n - start:,} more",
                )
            if op in _LONGS and size > _MAX_LONG_BYTES:
                raise _damaged(
                    where, f"byte {pos:,} holds an integer of {size:,} bytes (torch writes 8)"
                )
            if op in _STRINGS:
                recent = [recent[1], bytes(data[start : start + min(size, 100)])]
            pos = start + size
        elif op in _TUPLES:
            tuples += 1
            pos += 1
        elif op == _FRAME:
            pos = _after_frame(data, pos, where)
        elif op == _PROTO:
            pos += 2
        elif op in _FIXED:
            pos = _after_fixed(data, pos, where, memo_limit)
        elif op in _LINES:
            pos = _after_line(data, pos, where, memo_limit)
        elif op == _STOP:
            return tuples
        elif op in _REFUSED:
            raise _refused(data, pos, recent, where)
        else:
            raise _damaged(where, f"byte {pos:,} (0x{op:02x}) is not a pickle opcode")
        if tuples > MAX_TUPLES:
            raise _damaged(
                where,
                f"it builds over {MAX_TUPLES:,} tuples (torch writes one per segment)",
            )


def _after_frame(data: Any, pos: int, where: str) -> int:
    """The position after the FRAME header at `pos`, once its size is one the file holds."""
    n = len(data)
    if pos + 9 > n:
        raise _damaged(where, f"the file ends inside the frame header at byte {pos:,}")
    size = int.from_bytes(data[pos + 1 : pos + 9], "little")
    if size > n - pos - 9:
        raise _damaged(
            where,
            f"the frame at byte {pos:,} declares {size:,} bytes, but the file holds "
            f"{n - pos - 9:,} more",
        )
    return pos + 9  # a frame only groups the opcodes after it: they are scanned as usual


def _after_fixed(data: Any, pos: int, where: str, memo_limit: int) -> int:
    """The position after the fixed-size opcode at `pos` the run pattern did not take, once
    its argument is in the file (and, for LONG_BINPUT, a memo index within `memo_limit`)."""
    n = len(data)
    op = data[pos]
    width = _FIXED[op]
    if pos + 1 + width > n:
        raise _damaged(where, f"the file ends inside the opcode at byte {pos:,}")
    if op == _LONG_BINPUT:
        index = int.from_bytes(data[pos + 1 : pos + 5], "little")
        if index > memo_limit:
            raise _damaged(
                where,
                f"byte {pos:,} stores memo entry {index:,}, far more than a file of "
                f"{n:,} bytes can hold (the unpickler would allocate memory for "
                "every entry up to it)",
            )
    return pos + 1 + width


def _after_line(data: Any, pos: int, where: str, memo_limit: int) -> int:
    """The position after the text opcode at `pos` (its argument a line), once the line ends,
    a number in it is not absurdly long, and a PUT's memo index is within `memo_limit`."""
    op = data[pos]
    end: int = data.find(b"\n", pos + 1)
    if end < 0:
        raise _damaged(where, f"the text opcode at byte {pos:,} has no end of line")
    text = bytes(data[pos + 1 : end])
    if op in (ord("I"), ord("L"), ord("p")) and len(text) > _MAX_TEXT_DIGITS:
        raise _damaged(where, f"byte {pos:,} holds a number of {len(text):,} digits (torch: 20)")
    if op == _PUT:
        try:
            index = int(text)
        except ValueError:
            raise _damaged(where, f"byte {pos:,} stores a memo entry {text[:20]!r}") from None
        if index > memo_limit:
            raise _damaged(where, f"byte {pos:,} stores memo entry {index:,}")
    return end + 1


def _refused(data: Any, pos: int, recent: list[bytes], where: str) -> SnapshotFormatError:
    """The error for the refused opcode at `pos`, naming the global it would load where it
    names one (GLOBAL's two lines; STACK_GLOBAL's two `recent` strings)."""
    op = data[pos]
    named = ""
    if op == ord("c"):
        lines = bytes(data[pos + 1 : pos + 200]).split(b"\n")[:2]
        named = " " + ".".join(x.decode("utf-8", "replace") for x in lines)
    elif op == 0x93:
        named = " " + ".".join(x.decode("utf-8", "replace") for x in recent)
    return SnapshotFormatError(
        f"{where}: the pickle holds {_REFUSED[op]}{named} at byte {pos:,}; refused, never "
        "executed. A memory snapshot holds only dicts, lists, strings and numbers: "
        "this file is not one (or was altered); re-dump it with "
        "torch.cuda.memory._dump_snapshot."
    )


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain containers and scalars: any global a pickle
    names (a class, a function such as os.system) is refused before it is looked up. The
    scan refuses those opcodes first; this is the second line."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotFormatError(
            f"the pickle names class {module}.{name}; refused, never executed. A memory "
            "snapshot holds only dicts, lists, strings and numbers: this file is not one "
            "(or was altered); re-dump it with torch.cuda.memory._dump_snapshot."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotFormatError(
            "the pickle refers to a persistent object; refused. A memory snapshot holds "
            "only plain containers and scalars."
        )


_UNPICKLE_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    MemoryError,
    OverflowError,
    RecursionError,
    OSError,
    zlib.error,
)
_stack_lock = threading.Lock()


def _on_big_stack(work: Callable[[], Any], stack_bytes: int) -> Any:
    """Run work() on a thread with a C stack of `stack_bytes` and return its result (or
    raise its exception)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    with _stack_lock:
        old = threading.stack_size()
        try:
            threading.stack_size(stack_bytes)
            thread = threading.Thread(target=target, name="gpuprof_nb-unpickle")
            thread.start()
        finally:
            threading.stack_size(old)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def unpickle(data: Any, where: str, stream: Any = None) -> Any:
    """Scan the pickle in `data` (bytes-like), then unpickle it: from `stream` when given (a
    binary file holding the same bytes, read from its current position), else from `data`.
    Raises SnapshotFormatError, naming `where`, for anything that is not a plain pickle."""
    tuples = scan(data, where)
    source = stream if stream is not None else io.BytesIO(data)

    def load() -> Any:
        return _RestrictedUnpickler(source).load()

    try:
        if tuples <= SAFE_TUPLES:
            return load()
        stack = min(1 << 30, (16 << 20) + _STACK_PER_TUPLE * tuples)
        return _on_big_stack(load, (stack + 0xFFFF) & ~0xFFFF)
    except SnapshotFormatError as e:
        raise SnapshotFormatError(f"{where}: {e}") from None
    except _UNPICKLE_ERRORS as e:
        raise SnapshotFormatError(
            f"{where}: not a readable pickle ({type(e).__name__}: {str(e)[:200]}); is the "
            "file truncated? Dump it again with torch.cuda.memory._dump_snapshot(path)."
        ) from None
