"""Errors of the service layer, each with its HTTP status and the field it is about."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """A refusal the caller must see: HTTP ``status``, one sentence, and optionally the input
    field it concerns (``location``: path, query, json, form, files, headers)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        location: str | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.location = location
        self.field = field
        self.headers = headers or {}

    @property
    def errors(self) -> dict[str, Any] | None:
        """flask-smorest's ``errors`` shape: ``{location: {field: [message]}}``."""
        if self.location and self.field:
            return {self.location: {self.field: [self.message]}}
        return None

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def not_found(field: str, message: str, location: str = "path") -> ServiceError:
    return ServiceError(404, message, location=location, field=field)


def invalid(location: str, field: str, message: str, status: int = 422) -> ServiceError:
    return ServiceError(status, message, location=location, field=field)


def forbidden(message: str) -> ServiceError:
    return ServiceError(403, message)


def conflict(message: str) -> ServiceError:
    return ServiceError(409, message)
