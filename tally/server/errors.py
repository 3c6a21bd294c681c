"""The one place where an error becomes an HTTP status and OpenAI's error body.

Every failure of a request, whatever raised it, passes through `as_tally_error` then
`error_response`, so clients always get `{"error": {"message", "type", "param", "code"}}`."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tally.errors import InvalidRequestError, QueueFullError, TallyError, error_body

log = logging.getLogger("tally.server")


class UnsupportedMediaTypeError(InvalidRequestError):
    http_status = 415


class ServerDrainingError(TallyError):
    """SIGTERM received: running requests finish, new ones are turned away."""

    http_status = 503
    error_type = "service_unavailable"

    def __init__(self) -> None:
        super().__init__("the server is shutting down and admits no new requests; retry on another replica")
        self.retry_after_s = 5.0


def as_tally_error(exc: BaseException) -> TallyError:
    if isinstance(exc, TallyError):
        return exc
    if isinstance(exc, (ValidationError, RequestValidationError)):
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return InvalidRequestError(f"{loc or 'body'}: {first.get('msg', 'invalid value')}", param=loc or None)
    err = TallyError(f"internal server error: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def error_response(exc: BaseException, body: Callable[[TallyError], dict] = error_body) -> JSONResponse:
    """`body`: the API's error shape (OpenAI's unless told)."""
    err = as_tally_error(exc)
    if err.http_status == 500:  # a bug of ours, not the client's: keep the traceback
        log.error("internal error: %s", err.message, exc_info=err.__cause__ or err)
    headers = {}
    retry_after_s = getattr(err, "retry_after_s", None)
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return JSONResponse(body(err), status_code=err.http_status, headers=headers)


REJECTION_REASONS = ("queue_full", "draining")


def rejection_reason(err: TallyError) -> str | None:
    """Requests turned away by admission control, not by their content (tally:request_rejected_total)."""
    if isinstance(err, QueueFullError):
        return REJECTION_REASONS[0]
    if isinstance(err, ServerDrainingError):
        return REJECTION_REASONS[1]
    return None
