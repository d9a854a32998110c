"""How much of a result any display shows at most, whatever the input held: a name is cut
for display (the result keeps it whole), a table shows its first rows and says how many it
hides, and a whole report stays within a few MB. Real reports stay far within these (the
longest kernel name among the real traces in tests/data and ../shared/traces is about 5,200
characters, the longest table a few hundred rows), so they render as before; a crafted or
damaged file cannot make a report of hundreds of MB that freezes the browser."""

from __future__ import annotations

import re

# Characters of one name or value shown; the rest is replaced by a count.
MAX_SHOWN_CHARS = 8_000
# Rows of one table shown.
MAX_TABLE_ROWS = 300
# Characters of one report's HTML, and of its text (see render/bundle.py).
MAX_REPORT_CHARS = 4_000_000

_SURROGATE = re.compile("[\ud800-\udfff]")


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """Return `text` cut to about `limit` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters, kept whole in the result]"


def hidden_rows(hidden: int) -> str:
    """The line that stands for the rows a table does not show."""
    return f"… {hidden:,} more rows not shown (the result object holds every row)"


def visible_surrogates(text: str) -> str:
    """Return `text` with every lone surrogate (from names a file held that are not valid
    Unicode) replaced by U+FFFD, so it can be encoded and shown; unchanged when none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text
