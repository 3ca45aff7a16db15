"""Secrets out of what trinity prints: config dumps, validation errors, URLs in logs.

One place for the rule, so ``trinity config``, the loader's error messages and the bus's
connection logs hide the same things the same way.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: What a secret is printed as.
REDACTED = "***"
#: URL schemes of NATS servers: a user without a password in such a URL is a token.
NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def redact_url(url: str) -> str:
    """``url`` (one URL or a comma-separated list) with every password replaced by ``***``;
    so is a user without a password in a NATS URL (``nats://TOKEN@host`` is token auth).

    Strings that are not URLs with credentials come back unchanged."""
    if "@" not in url:
        return url
    out = []
    for u in url.split(","):
        stripped = u.strip()
        has_scheme = "://" in stripped
        try:
            parts = urlsplit(stripped if has_scheme else "nats://" + stripped)
            user, password = parts.username, parts.password
        except ValueError:
            out.append(u)
            continue
        if password:
            userinfo = f"{user}:{REDACTED}"
        elif user and parts.scheme in NATS_SCHEMES:
            userinfo = REDACTED
        else:
            out.append(u)
            continue
        new = urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc.rpartition('@')[2]}"))
        out.append(u.replace(stripped, new if has_scheme else new.removeprefix("nats://")))
    return ",".join(out)


#: Names of config keys (at any depth, also inside free dicts such as ``monitor_args`` or
#: ``env_vars``) whose values are secrets: printed as ``***``.
SECRET_KEY = re.compile(
    r"(?:^|_)(?:token|password|passwd|pwd|secret|api_?key|access_key|secret_key|private_key"
    r"|credentials?)$",
    re.IGNORECASE,
)


def redact_secrets(node: Any, key: str = "") -> Any:
    """A copy of a plain config tree (``model_dump`` output) fit to print: the value of every
    secret-looking key (:data:`SECRET_KEY`) is ``***`` and every URL loses its password."""
    if key and SECRET_KEY.search(key) and node not in (None, "", {}, []):
        return REDACTED
    if isinstance(node, dict):
        return {k: redact_secrets(v, str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_secrets(v) for v in node]
    if isinstance(node, str):
        return redact_url(node)
    return node
