"""bench/load_faults.py's count of the SIGTERM leg: a call whose connection the stopped proxy's
listener refused never reached it, and is not counted as a call in flight left unanswered."""

from __future__ import annotations

import httpx

from bench.load_faults import refused_at_connect


def _raised(inner: BaseException, outer: type[Exception]) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer("the client's own error") from exc
    except Exception as exc:
        return exc


def test_a_refused_connection_is_found_inside_the_clients_exception_group() -> None:
    refused = _raised(ConnectionRefusedError(111, "Connection refused"), httpx.ConnectError)
    assert refused_at_connect(BaseExceptionGroup("task group", [RuntimeError("cancelled"), refused]))
    assert refused_at_connect(httpx.ConnectError("All connection attempts failed"))


def test_a_stream_broken_after_the_request_went_out_is_not_a_refusal() -> None:
    broken = _raised(ConnectionResetError(104, "Connection reset by peer"), httpx.ReadError)
    assert not refused_at_connect(BaseExceptionGroup("task group", [broken]))
    assert not refused_at_connect(RuntimeError("no answer"))
