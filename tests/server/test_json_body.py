"""The request body parser (server/json_body.py) against the json module: the same values for any JSON
(strings cut into windows of 1 to 64 characters across escapes and surrogate pairs), the same refusals,
and no single C call long enough to stall the event loop (a ticking thread's largest gap)."""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassbox.server.json_body import MAX_JSON_VALUES, BodyError, parse_body

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)))  # any text JSON can carry
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON, ascii_only=st.booleans(), window=st.sampled_from([1, 2, 5, 7, 12, 64]))
def test_the_windowed_scanner_reads_what_json_loads_reads(value: Any, ascii_only: bool, window: int) -> None:
    tricky = 'a"b\\ \u00e9\U0001f600\n' * 3  # a quote, a backslash, non-ASCII, a pair, a newline
    raw = json.dumps({"v": value, "s": tricky}, ensure_ascii=ascii_only).encode()
    assert parse_body(raw, window=window, c_parser_bytes=0) == json.loads(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "unterminated',
        b'{"a": "bad \\x escape"}',
        b'{"a": "\\u12"}',
        b'{"a": "ctl \x01"}',
        b"[1, 2,",
        b"{",
    ],
)
def test_malformed_json_is_refused_as_json_loads_refuses_it(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    for c_parser_bytes in (0, 1 << 20):
        with pytest.raises(BodyError, match="malformed JSON body"):
            parse_body(raw, window=3, c_parser_bytes=c_parser_bytes)


def test_lone_surrogates_and_too_many_values_are_refused() -> None:
    for raw in (b'{"p": "ab\\ud800"}', b'{"p": ["ok", "\\udc00x"]}', b'{"p": "\\ud83d\\ud83d"}'):
        with pytest.raises(BodyError, match="lone UTF-16 surrogate"):
            parse_body(raw, window=4, c_parser_bytes=0)
    assert parse_body(b'{"p": "\\ud83d\\ude00"}', window=7, c_parser_bytes=0) == {"p": "\U0001f600"}
    body = json.dumps({"prompt": [7] * MAX_JSON_VALUES}).encode()
    with pytest.raises(BodyError, match="more than"):
        parse_body(body)


def _largest_gap(work: Callable[[], object]) -> float:
    """The largest gap (s) between the ticks of a thread sleeping 1 ms while another thread runs ``work``,
    with this process's cyclic GC off: late in the suite one of its full collections over pytest's heap takes
    about a second and keeps the GIL; that pause is the test process's, not the parser's."""
    gc.disable()
    try:
        return _gaps_of(work)
    finally:
        gc.enable()


def _gaps_of(work: Callable[[], object]) -> float:
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    done.set()
    ticker.join()
    return max(gaps)


def _python_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(100))


def _parse_quietly(raw: bytes) -> None:
    try:
        parse_body(raw)
    except BodyError:
        pass  # the numbers are past the value cap


@pytest.mark.parametrize(
    "value",
    [{"content": "ab\n" * 2_500_000}, {"prompt": [7] * 3_300_000}, {"prompt": "x" * 10_000_000}],
    ids=["10 MB of escapes", "10 MB of numbers", "10 MB of plain text"],
)
def test_no_c_call_holds_the_gil_for_long(value: dict[str, Any]) -> None:
    """While another thread parses 10 MB, a thread ticking every ms waits at most 100 ms longer than while
    that thread runs plain Python (the baseline, taken here: the GIL's 5 ms switch interval and this
    machine's scheduling under its load). The largest C call the parser makes reads one window (16K
    characters, ~1.4 ms loaded) or one number; json.loads took 250-340 ms on the escapes here (load 9 on
    2 cores), all of it in one call."""
    raw = json.dumps(value).encode()
    baseline = _largest_gap(lambda: _python_for(1.0))
    during = _largest_gap(lambda: _parse_quietly(raw))
    assert during < baseline + 0.1, f"{during * 1000:.0f} ms, plain Python: {baseline * 1000:.0f} ms"
