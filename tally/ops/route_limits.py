"""What `tally route` holds its clients to, as `tally serve` does (tally/http_limits.py): connections, the time to
send headers and body, the body's size and nesting, and one deadline for the whole request; and the errors it
answers with, in OpenAI's shape, when one is passed or no replica can serve."""
from __future__ import annotations

import math
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse

from tally.errors import TallyError, error_body
from tally.http_limits import BODY_TIMEOUT_S, read_body
from tally.json_text import check_depth


@dataclass(frozen=True)
class RouteLimits:
    max_body_bytes: int = 16 * 2**20  # tally serve's --max-body-bytes
    body_timeout_s: float = BODY_TIMEOUT_S
    request_timeout_s: float = 600.0  # from the request's arrival to its last byte
    header_timeout_s: float = 10.0
    max_connections: int = 1024


class NoReplicaError(TallyError):
    http_status = 503
    error_type = "service_unavailable"
    retry_after_s = 1.0


class ReplicaBrokeError(TallyError):
    """The replica closed or failed the stream it had begun."""

    http_status = 502
    error_type = "bad_gateway"


async def read_request(request: Request, limits: RouteLimits) -> bytes:
    """The body, once it is known to be within the limits; the router parses it (prefix affinity), so its nesting
    is checked first."""
    body = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
    check_depth(body, "request body")
    return body


def error_response(err: TallyError) -> JSONResponse:
    retry_after_s = getattr(err, "retry_after_s", None)
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))} if retry_after_s is not None else {}
    return JSONResponse(error_body(err), status_code=err.http_status, headers=headers)
