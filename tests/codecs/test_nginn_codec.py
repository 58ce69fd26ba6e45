"""NGinn's formats, decoded the way NGinn itself reads them."""

from __future__ import annotations

import pytest

from bridge.errors import BadRow
from bridge.codecs.nginn import body_type, endpoint_queue, parse_exception, parse_headers


def test_headers_split_and_trimmed_like_string_to_headers() -> None:
    assert parse_headers("_NG-ReplyTo=sql://db/Q1| MyHeader = abc ||x=") == {"_NG-ReplyTo": "sql://db/Q1", "MyHeader": "abc", "x": ""}
    assert parse_headers("") == {} and parse_headers(None) == {}
    assert parse_headers("a=1|a=2") == {"a": "2"}  # NGinn's dictionary keeps the last


@pytest.mark.parametrize("text, why", [("Filter=a=b", "more than one '='"), ("JustAName", "has no '='"), ("a=1|b", "has no '='")])
def test_header_pairs_nginn_cannot_read_are_bad_rows(text: str, why: str) -> None:
    with pytest.raises(BadRow, match=why):
        parse_headers(text)


def test_endpoints() -> None:
    assert endpoint_queue("sql://testdb1/MQueue2") == "MQueue2"
    assert endpoint_queue("") is None and endpoint_queue("local") is None and endpoint_queue("sql://a/b/c") is None


def test_body_type() -> None:
    assert body_type('{"$type":"Orders.PlaceOrder, Orders","Id":1}') == "Orders.PlaceOrder, Orders"
    assert body_type('{"Id":1}') is None
    with pytest.raises(BadRow, match="not valid JSON"):
        body_type("{oops")
    with pytest.raises(BadRow, match="NULL"):
        body_type(None)


def test_dotnet_framework_exception_text() -> None:
    text = (
        "System.ApplicationException: Outer failed ---> System.IO.IOException: disk gone\r\n"
        "   at A.B.C()\r\n   --- End of inner exception stack trace ---\r\n   at D.E.F()"
    )
    e = parse_exception(text)
    assert (e.exception_type, e.message, e.inner_exception_type) == ("System.ApplicationException", "Outer failed", "System.IO.IOException")


def test_dotnet_core_exception_with_multiline_message() -> None:
    text = "Shop.OrderRejected: line one\nline two\n   at Shop.Handler.Handle()"
    e = parse_exception(text)
    assert e.exception_type == "Shop.OrderRejected" and e.message == "line one\nline two" and e.inner_exception_type is None


def test_exception_text_that_is_not_dotnet_keeps_its_first_line() -> None:
    assert parse_exception("timeout after 30 s\nmore").exception_type == "Unknown"
    assert parse_exception("timeout after 30 s\nmore").message == "timeout after 30 s"
    assert parse_exception(None).message == "NGinn recorded no error information"
