"""XML documents as JSON (issue 47: a BizTalk body an endpoint reads as JSON), by the convention of
Newtonsoft's `JsonConvert.SerializeXmlNode`, which .NET teams know: `{"<root>": ...}`; an element's
attributes as `"@name"` (namespace declarations too, as `"@xmlns:p"`; names keep their prefixes);
an element with text alone is its text, one with nothing is null; text beside attributes is
`"#text"`; children by name, a name that repeats a list in document order.

Lossless for the common documents (elements, attributes, text, CDATA as text). What the
convention would lose is refused, so that the message is quarantined rather than changed: text
mixed among child elements, and a DOCTYPE (whose entities could also expand without bound).
Comments and processing instructions are not content, and are left out."""

from __future__ import annotations

from typing import Any
from xml.dom import Node, minidom
from xml.parsers.expat import ExpatError


def xml_to_json(data: bytes) -> dict[str, Any]:
    """The document as JSON-ready values; ValueError saying what cannot be converted."""
    if b"<!DOCTYPE" in data[:4096].upper():
        raise ValueError("the XML has a DOCTYPE: not converted (its entities could change or grow the document)")
    try:
        document = minidom.parseString(data)
    except ExpatError as e:
        raise ValueError(f"the body is not XML ({e})") from None
    root = document.documentElement
    if root is None:
        raise ValueError("the XML has no root element")
    return {root.tagName: _element(root)}


def _element(element: Any) -> Any:
    attributes = {f"@{name}": value for name, value in element.attributes.items()}
    children = [c for c in element.childNodes if c.nodeType == Node.ELEMENT_NODE]
    text = "".join(c.data for c in element.childNodes if c.nodeType in (Node.TEXT_NODE, Node.CDATA_SECTION_NODE))
    if children and text.strip():
        raise ValueError(f"<{element.tagName}> mixes text with child elements, which the JSON convention cannot keep in order")
    if not children:
        if not attributes:
            return text if text else None
        return {**attributes, "#text": text} if text else attributes
    out: dict[str, Any] = dict(attributes)
    repeated: set[str] = set()
    for child in children:
        name, value = child.tagName, _element(child)
        if name not in out:
            out[name] = value
        elif name in repeated:
            out[name].append(value)
        else:
            out[name] = [out[name], value]
            repeated.add(name)
    return out
