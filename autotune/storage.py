"""Storage URLs: never printed with their password."""

from __future__ import annotations

import re


def redact(url: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)
