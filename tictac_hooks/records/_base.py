"""What every record shares: the error a malformed record raises, and the helpers its
``from_json`` reads fields with."""

from __future__ import annotations

from typing import Any, Iterable, Mapping


class RecordError(ValueError):
    """A record does not have the fields of its schema."""


def _field(d: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return d[key]
    except (KeyError, TypeError):
        raise RecordError(f"{what} record has no {key!r}: {str(d)[:200]}") from None


def _floats(values: Iterable[Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _optional(value: Any, kind: Any) -> Any:
    return None if value is None else kind(value)
