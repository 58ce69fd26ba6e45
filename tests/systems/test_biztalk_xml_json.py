"""BizTalk bodies (XML) under the mapping's `[[body]] xml` rule (issue 47): "json" sends the
document as JSON by Newtonsoft's SerializeXmlNode convention (NServiceBus.ContentType
application/json), "keep" sends the XML bytes as they are; a body the convention cannot keep
(not XML, mixed content, a DOCTYPE) is quarantined naming the rule. SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from bridge.codecs.xmljson import xml_to_json
from tests.systems.test_biztalk_source import MAPPING, SMALL, BizTalk, fx, make_bt


@pytest.fixture(params=["sqlite", "postgres"])
def bt_json(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BizTalk]:
    rules = ("\n[[body]]\nwhen = 'type == \"http://example.org/orders#Order\"'\nxml = \"json\"\n"
             "\n[[body]]\nwhen = 'type != \"http://example.org/orders#Order\"'\nxml = \"keep\"\n")
    yield from make_bt(request.param, request, tmp_path, mapping=MAPPING + rules)


def test_an_order_arrives_as_json_and_the_rest_as_xml(bt_json: BizTalk) -> None:
    import zlib  # noqa: F401 - the fixture's part is compressed; the source decodes it

    bt_json.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
    assert bt_json.cli("sync", "--once") == 0
    [row] = bt_json.rows("Orders")
    assert row["headers"]["NServiceBus.ContentType"] == "application/json"
    body = orjson.loads(bytes(row["body"]))
    assert isinstance(body, dict) and len(body) == 1  # {"<root element>": ...}
    assert bt_json.cli("verify", "--deep") == 0  # mapped again, the same JSON


def test_the_convention_keeps_what_it_can_and_refuses_what_it_cannot() -> None:
    doc = xml_to_json(b'<ns0:Order xmlns:ns0="urn:o" id="7"><ns0:Line sku="A">2</ns0:Line><ns0:Line sku="B"/>'
                      b'<Note><![CDATA[x < y]]></Note><Empty/></ns0:Order>')
    assert doc == {"ns0:Order": {"@xmlns:ns0": "urn:o", "@id": "7", "ns0:Line": [{"@sku": "A", "#text": "2"}, {"@sku": "B"}],
                                 "Note": "x < y", "Empty": None}}
    for bad, why in ((b'{"a": 1}', "not XML"), (b"<a>t<b/>u</a>", "mixes text"),
                     (b'<!DOCTYPE a [<!ENTITY x "y">]><a>&x;</a>', "DOCTYPE")):
        with pytest.raises(ValueError, match=why):
            xml_to_json(bad)
