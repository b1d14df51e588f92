"""Text from records as Markdown that shows it and nothing more, for summary.md and the GitHub step summary.

A record's text (a failure message, a check id, a row folder's name) may hold what Markdown reads as structure: a
line break then ``# QUALIFIES`` (CommonMark ends a line at ``\\r`` too), raw HTML (``<h1>``, which GitHub renders),
emphasis, links, a table's ``|``. ``escape`` makes it one line with every such character backslash-escaped, which
CommonMark and GitHub show as the character itself; ``code`` makes it one code span whatever backticks it holds.
Both return ``Safe``: the Markdown template prints a Safe value as it is and escapes every other value it prints
(render.environment's finalize), so text from a record reaches the page escaped once, whether or not the template
line remembered to.
"""

from __future__ import annotations

import re


class Safe(str):
    """Markdown already escaped (or written by this package): printed as it is."""


# Line ends CommonMark or a browser honours: \r\n, \r, \n, and the Unicode ones; tabs and other control characters.
_BREAKS = re.compile(r"[\r\n\x0b\x0c\x85\u2028\u2029\t\x00-\x08\x0e-\x1f\x7f]+")
# What opens Markdown structure anywhere in a line: escapes, code, raw HTML and autolinks (<), tables (|),
# strikethrough (~), math ($), and * emphasis, which works inside words too.
_SPECIAL = re.compile(r"([\\`*<>|~$])")
# _ emphasis only where it is not inside a word (GFM); a link or image only where ] meets ( or [.
_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_LINK = re.compile(r"\](?=[(\[])")
# What opens a block only at the start of a line: the value may start one (a list item's text): headings, quotes,
# list markers, setext underlines, a thematic break.
_LEADING = re.compile(r"^(\s*|\s*\d{1,9})(#(?=#{0,5}(?:\s|$))|>|[-+](?=\s|[-\s]*$)|(?<=\d)[.)](?=\s|$))")


def escape(value: object) -> Safe:
    """``value`` as one line of Markdown text that renders as itself."""
    if isinstance(value, Safe):
        return value
    text = _SPECIAL.sub(r"\\\1", _BREAKS.sub(" ", str(value)))
    text = _LINK.sub(r"\\]", _UNDERSCORE.sub(r"\\_", text))
    return Safe(_LEADING.sub(r"\1\\\2", text, count=1))


def code(value: object) -> Safe:
    """``value`` as one inline code span: a fence longer than any run of backticks inside it, pipes escaped (a GFM
    table splits a cell at ``|`` even inside code)."""
    text = _BREAKS.sub(" ", str(value)).replace("|", "\\|")
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return Safe(f"{fence}{pad}{text}{pad}{fence}")


def block(lines: list[str]) -> list[str]:
    """``lines`` as one fenced code block: a fence longer than any run of backticks in them, so no line closes it
    (a line break inside a line -- \\r included -- is a line of its own)."""
    flat = [part for line in lines for part in re.split(r"\r\n|[\r\n\x0b\x0c\x85\u2028\u2029]", str(line))]
    fence = "`" * max(3, max((len(m) for line in flat for m in re.findall(r"`+", line)), default=0) + 1)
    return [fence, *flat, fence]


def url(value: object) -> Safe:
    """A web address as an autolink (``<https://...>``, inside which Markdown reads nothing); other text escaped."""
    text = str(value)
    return Safe(f"<{text}>") if re.fullmatch(r"https?://[^\s<>`\\]+", text) else escape(text)


def trusted(value: object) -> Safe:
    """Markdown this package wrote (a table rule, a section built of escaped parts): printed as it is."""
    return Safe(str(value))
