"""Hugging Face Spaces: a Space's URL from its name, and the token sent to it.

``owner/space`` is served at ``https://<subdomain>.hf.space``, where the subdomain
is the name lower-cased with every character outside ``[a-z0-9]`` replaced by
``-`` (OpenEnv's ``hf_space_subdomain``). A private Space needs a bearer token:
the caller's, else ``HF_TOKEN``, else the Hugging Face token file
(``$HF_TOKEN_PATH``, ``$HF_HOME/token``, ``~/.cache/huggingface/token``).

The token goes into the client's own headers, so it is sent to that Space's host
only: the client never follows a redirect, and it connects nowhere else. Like
every header it is never logged, and it appears in no repr, span or error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["SPACE_DOMAIN", "hf_space_subdomain", "hf_token", "is_space_name", "space_host",
           "space_name_of", "space_url"]

#: Where Hugging Face serves Spaces.
SPACE_DOMAIN = "hf.space"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def hf_space_subdomain(repo_id: str) -> str:
    """The subdomain (and registry name) of Space ``repo_id``, as the Hub derives it."""
    return re.sub(r"[^a-z0-9]", "-", repo_id.lower())


def is_space_name(value: str) -> bool:
    """Whether ``value`` is a Space name (``owner/space``) rather than a URL."""
    return "://" not in value and bool(_NAME.match(value))


def space_host(repo_id: str) -> str:
    """The host serving Space ``repo_id``: ``<subdomain>.hf.space``."""
    return f"{hf_space_subdomain(repo_id)}.{SPACE_DOMAIN}"


def space_url(repo_id: str) -> str:
    """The base URL of Space ``repo_id``: ``https://<subdomain>.hf.space``.

    Raises:
        ValueError: ``repo_id`` is not of the form ``owner/space``.
    """
    if not is_space_name(repo_id):
        raise ValueError(f"a Space name looks like 'owner/space', got {repo_id!r}")
    return f"https://{space_host(repo_id)}"


def space_name_of(url: str) -> str | None:
    """The Space a URL points at (its host, ``<subdomain>.hf.space``), else ``None``."""
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:  # not a URL: the client's parsing of base_url says why
        return None
    if host.endswith("." + SPACE_DOMAIN) and host.count(".") == 2:
        return host
    return None


def hf_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The Hugging Face token of this machine: ``HF_TOKEN``, else the token file.

    Args:
        environ: the environment to read (default: ``os.environ``).
    """
    env = os.environ if environ is None else environ
    token = (env.get("HF_TOKEN") or "").strip()
    if token:
        return token
    candidates = []
    if env.get("HF_TOKEN_PATH"):
        candidates.append(Path(env["HF_TOKEN_PATH"]))
    home = env.get("HF_HOME")
    candidates.append(Path(home) / "token" if home else
                      Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                      / "huggingface" / "token")
    for path in candidates:
        try:
            text = path.expanduser().read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text:
            return text
    return None
