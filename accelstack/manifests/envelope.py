"""The envelope every manifest carries, and its expiry: checked here and nowhere else.

    {"format": "accelstack-manifest", "format_version": 1, "source": "official",
     "version": 42, "expires": "2027-06-01T00:00:00Z", "kind": "ggml" | "torch", ...body}

``source`` names the channel whose ``version`` must never go down (rollback protection, see
:mod:`accelstack.manifests.rollback`); ``expires`` bounds how long a captured manifest can be
replayed to a user.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional, Tuple, cast

from ..domain import STACKS, Stack
from ..errors import Action
from ..limits import MAX_DATETIME_YEAR, MIN_DATETIME_YEAR
from .errors import ExpiredManifestFormatError
from .fields import check_id, describe, fail, get, get_str, quote

__all__ = ["KINDS", "MANIFEST_FORMAT", "SUPPORTED_FORMAT_VERSIONS", "Envelope", "check_envelope", "is_expired",
           "parse_expires", "utcnow"]

MANIFEST_FORMAT = "accelstack-manifest"
SUPPORTED_FORMAT_VERSIONS: Tuple[int, ...] = (1,)
KINDS: Tuple[Stack, ...] = STACKS
_ISO = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?(Z|[+-][0-9]{2}:[0-9]{2})\Z")


@dataclass
class Envelope:
    """What every manifest says about itself."""

    source: str
    version: int
    expires: str
    kind: Stack
    format_version: int = 1

    @property
    def label(self) -> str:
        return f"{self.kind} manifest '{self.source}' version {self.version}"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def parse_expires(value: str, path: str = "expires") -> datetime:
    """An ISO-8601 date-time with a zone (``Z`` or ``+hh:mm``) as an aware UTC datetime, in the
    years :data:`~accelstack.limits.MIN_DATETIME_YEAR` to ``MAX_DATETIME_YEAR`` (near year 1 or
    9999 converting it to UTC would overflow)."""
    if not isinstance(value, str) or not _ISO.match(value):
        raise fail(path, f"{quote(value) if isinstance(value, str) else describe(value)} is not an ISO-8601 date-time with a time zone, e.g. 2027-06-01T00:00:00Z")
    year = int(value[:4])
    if not MIN_DATETIME_YEAR <= year <= MAX_DATETIME_YEAR:
        raise fail(path, f"{value!r} is outside the years {MIN_DATETIME_YEAR} to {MAX_DATETIME_YEAR} accepted")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    if "." in text:  # fromisoformat before 3.11 reads only 3 or 6 fraction digits
        head, _, rest = text.partition(".")
        digits = rest[:-6]
        text = f"{head}.{(digits + '000000')[:6]}{rest[-6:]}"
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise fail(path, f"{value!r} is not a valid date-time") from None


def is_expired(envelope: Envelope, now: Optional[datetime] = None) -> bool:
    now = now or utcnow()
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return now >= parse_expires(envelope.expires)


def check_envelope(doc: Any, *, now: Optional[datetime] = None, check_expiry: bool = True,
                   expect: Optional[Stack] = None) -> Envelope:
    """The envelope of ``doc``; raise for a wrong format, unknown format version, a kind other
    than ``expect`` (when given), a bad or past expiry."""
    if not isinstance(doc, dict):
        raise fail("", f"a manifest must be a JSON object, got {type(doc).__name__}")
    fmt = get_str(doc, "format", "")
    if fmt != MANIFEST_FORMAT:
        raise fail("format", f"expected {MANIFEST_FORMAT!r}, got {fmt!r}")
    fv = get(doc, "format_version", "", int)
    if fv not in SUPPORTED_FORMAT_VERSIONS:
        newer = fv > max(SUPPORTED_FORMAT_VERSIONS)
        raise fail(
            "format_version",
            f"unknown format version {fv} (this accelstack reads {', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))})",
            "upgrade accelstack to read this manifest" if newer else "the manifest is malformed; get it again from its publisher",
            action=Action.UPDATE_ACCELSTACK if newer else Action.NONE,
        )
    env = Envelope(
        source=check_id(get_str(doc, "source", ""), "source", "source (channel name)"),
        version=get(doc, "version", "", int),
        expires=get_str(doc, "expires", ""),
        kind=cast(Stack, get_str(doc, "kind", "", choices=KINDS)),
        format_version=fv,
    )
    if env.version < 0:
        raise fail("version", f"must be >= 0, got {env.version}")
    if expect is not None and env.kind != expect:
        raise fail("kind", f"expected a {expect} manifest, got {env.label}")
    parse_expires(env.expires)
    if check_expiry and is_expired(env, now):
        raise ExpiredManifestFormatError(
            f"expires: {env.label} expired on {env.expires}",
            "get a current manifest from its publisher (an expired one may list known-bad files), "
            "and check the system clock",
        )
    return env
