"""What a viewer shows of a report's HTML, replayed in Python (docs/viewers.md).

`jupyterlab_view(html)` applies the rules of JupyterLab's sanitizer (sanitize-html as
packages/apputils/src/sanitizer.ts configures it, v4.6): tags outside its list are dropped
and their text kept (a dropped <style>/<script> loses its body too), attributes outside its
lists are dropped, an attribute that is not boolean loses an empty value (a bare `hidden`),
inline style properties are kept only where the value passes its check (here: no `var()`).
`unboxed_tables` and `unscaled_images` find what would then be wider than the output.
`github_view(html)` applies the stricter rules reported for GitHub: no style, class or hidden,
no input/label/nav/svg, details kept.

Both return a `View`: what a browser would then show, as text pieces with where they came
from. A node is not shown inside an element with `hidden`, with `display:none`, or in a
closed <details> (except its <summary>). The browser test checks the real JupyterLab; this
checks every report of every real trace in a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = frozenset({"area", "br", "col", "hr", "img", "input", "source", "track", "wbr"})
# sanitize-html drops the body of these when they are not allowed.
NON_TEXT = frozenset({"script", "style", "textarea", "option", "noscript"})
# The tags JupyterLab's sanitizer keeps that reports could use (a subset of its list).
JUPYTERLAB_TAGS = frozenset(
    "a abbr b blockquote br button caption code col colgroup dd del details div dl dt em "
    "figcaption figure h1 h2 h3 h4 h5 h6 hr i img input ins kbd label li mark nav ol p pre q "
    "s samp section small span strong sub summary sup table tbody td tfoot th thead tr u ul "
    "var wbr".split()
)
JUPYTERLAB_ATTRS = {
    "*": {"class", "dir", "hidden", "id", "lang", "style", "title"},
    "a": {"href", "rel", "target", "type"},
    "details": {"open"},
    "img": {"align", "alt", "border", "height", "src", "width"},
    "input": {"checked", "disabled", "type", "value"},
    "label": {"for"},
    "td": {"align", "colspan", "nowrap", "rowspan", "valign", "width"},
    "th": {"align", "colspan", "nowrap", "rowspan", "valign", "width"},
}
GITHUB_TAGS = frozenset(
    "a abbr b blockquote br caption code dd del details div dl dt em figcaption figure h1 h2 "
    "h3 h4 h5 h6 hr i img ins kbd li mark ol p pre q s samp small span strong sub summary sup "
    "table tbody td tfoot th thead tr ul var wbr".split()
)
GITHUB_ATTRS = {
    "*": {"align", "alt", "dir", "height", "lang", "open", "title", "width"},
    "a": {"href"},
    "img": {"src"},
}
_BOOLEAN = frozenset({"checked", "disabled", "open", "nowrap"})


@dataclass(slots=True)
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | Text] = field(default_factory=list)


@dataclass(slots=True)
class Text:
    text: str
    # The tags the text sat in before sanitizing (to tell leaked SVG text).
    origin: tuple[str, ...]


@dataclass(slots=True)
class View:
    root: Node

    def shown_text(self) -> list[Text]:
        """Every text piece a browser would show, in order."""
        return [t for t in _shown(self.root) if isinstance(t, Text) and t.text.strip()]

    def shown_elements(self, tag: str) -> list[Node]:
        return [n for n in _shown(self.root) if isinstance(n, Node) and n.tag == tag]

    def text(self) -> str:
        return " ".join(" ".join(t.text for t in self.shown_text()).split())


def _hides(node: Node) -> bool:
    style = node.attrs.get("style", "").replace(" ", "")
    return "hidden" in node.attrs or "display:none" in style


def _shown(node: Node) -> list[Node | Text]:
    out: list[Node | Text] = []
    for child in node.children:
        if isinstance(child, Text):
            out.append(child)
            continue
        if _hides(child):
            continue
        out.append(child)
        if child.tag == "details" and "open" not in child.attrs:
            out.extend(
                x
                for c in child.children
                if isinstance(c, Node) and c.tag == "summary" and not _hides(c)
                for x in [c, *_shown(c)]
            )
            continue
        out.extend(_shown(child))
    return out


class _Sanitizer(HTMLParser):
    def __init__(self, tags: frozenset[str], attrs: dict[str, set[str]], styles: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.styles = tags, attrs, styles
        self.root = Node("root", {})
        self.kept: list[Node | None] = []  # per open source tag: its node, None if dropped
        self.origin: list[str] = []
        self.dropping = 0  # inside a dropped NON_TEXT tag

    def _parent(self) -> Node:
        return next((n for n in reversed(self.kept) if n is not None), self.root)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = None
        if tag in self.tags and not self.dropping:
            allowed = self.attrs.get("*", set()) | self.attrs.get(tag, set())
            kept = {}
            for name, value in attrs:
                value = value or ""
                if name not in allowed or (value == "" and name not in _BOOLEAN):
                    continue
                if name == "style":
                    if not self.styles:
                        continue
                    value = ";".join(p for p in value.split(";") if p and "var(" not in p)
                kept[name] = value
            if tag == "input":
                kept["disabled"] = "disabled"
            node = Node(tag, kept)
            self._parent().children.append(node)
        elif tag in NON_TEXT:
            self.dropping += 1
        if tag not in VOID:
            self.kept.append(node)
            self.origin.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID or tag not in self.origin:
            return
        while self.origin:
            open_tag = self.origin.pop()
            node = self.kept.pop()
            if node is None and open_tag in NON_TEXT and open_tag not in self.tags:
                self.dropping = max(0, self.dropping - 1)
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if not self.dropping:
            self._parent().children.append(Text(data, tuple(self.origin)))


def _view(html: str, tags: frozenset[str], attrs: dict[str, set[str]], styles: bool) -> View:
    parser = _Sanitizer(tags, attrs, styles)
    parser.feed(html)
    parser.close()
    return View(parser.root)


def jupyterlab_view(html: str) -> View:
    """What an untrusted notebook in JupyterLab shows of `html`."""
    return _view(html, JUPYTERLAB_TAGS, JUPYTERLAB_ATTRS, styles=True)


def github_view(html: str) -> View:
    """What GitHub's notebook view is reported to show of `html`."""
    return _view(html, GITHUB_TAGS, GITHUB_ATTRS, styles=False)


def leaked_svg_text(view: View) -> list[str]:
    """Text that came from inside an <svg> (labels, hover titles) and is shown as text."""
    return [t.text for t in view.shown_text() if "svg" in t.origin]


def _scrolls(node: Node) -> bool:
    return node.tag == "div" and "overflow-x:auto" in node.attrs.get("style", "").replace(" ", "")


def unboxed_tables(view: View) -> list[str]:
    """The tables (outside any other table) not inside a box that scrolls sideways by its
    own inline style: where the report's style is stripped, such a table wider than the
    output makes the whole output overflow (each as its header's text)."""
    out: list[str] = []

    def walk(node: Node, boxed: bool) -> None:
        for c in node.children:
            if not isinstance(c, Node):
                continue
            if c.tag == "table":
                if not boxed:
                    out.append(" ".join(View(c).text().split()[:6]))
                continue  # a table inside a table sits in its cell's width
            walk(c, boxed or _scrolls(c))

    walk(view.root, False)
    return out


def unscaled_images(view: View) -> list[str]:
    """The images whose inline style does not keep them to the output's width."""
    return [
        n.attrs.get("alt", "")
        for n in view.shown_elements("img")
        if "max-width:100%" not in n.attrs.get("style", "").replace(" ", "")
    ]


def shown_images(view: View) -> list[Node]:
    return [n for n in view.shown_elements("img") if n.attrs.get("src", "").startswith("data:")]
