"""One error family. Each error speaks to the person who must act; HTTP status mapping lives in
exactly one place (tally/server/errors.py) and reads `http_status` from here."""
from __future__ import annotations

class TallyError(Exception):
    """Base of every error Tally raises on purpose."""

    http_status = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def error_body(err: TallyError) -> dict:
    """OpenAI's error shape, the body of every error an HTTP front (tally serve, tally route) answers."""
    return {"error": {"message": err.message, "type": err.error_type, "param": err.param,
                      "code": err.http_status}}


class InvalidRequestError(TallyError, ValueError):
    """A request (prompt or sampling parameters) cannot be served as given."""

    http_status = 400
    error_type = "invalid_request_error"


class BodyTooLargeError(InvalidRequestError):
    http_status = 413


class BodyTimeoutError(InvalidRequestError):
    http_status = 408


class ConfigError(TallyError, ValueError):
    """Engine or CLI configuration is inconsistent."""

    http_status = 500
    error_type = "config_error"


class ModelLoadError(TallyError, ValueError):
    """A checkpoint is missing, corrupt, truncated, or of an unsupported architecture."""

    http_status = 500
    error_type = "model_load_error"


class ModelNotFoundError(TallyError):
    http_status = 404
    error_type = "not_found_error"


class QueueFullError(TallyError):
    """Admission control: the waiting queue is full. `retry_after_s` goes into Retry-After."""

    http_status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTimeoutError(TallyError):
    http_status = 504
    error_type = "timeout_error"


class EngineDeadError(TallyError):
    http_status = 503
    error_type = "engine_dead"
    retry_after_s = 5.0  # another replica now; this one too if it restarts its engine (--restart-on-failure)


ECHO_CHARS = 100  # of a client's value shown back in an error message


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` cut to `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[:limit] + "…"


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """A client's value as an error message shows it: its repr, clipped (a 100 KB model name comes back as its
    first hundred characters, not whole)."""
    return clip(repr(value), limit)
