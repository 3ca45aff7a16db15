"""Hugging Face hub ids as model and dataset paths: ``Org/Name`` or ``Org/Name@revision``.

The seeds' configs name models and datasets the way their users download them
(``model_path: Qwen/Qwen2.5-1.5B-Instruct``, ``path: openai/gsm8k``); a user who ran
``hf download Qwen/Qwen2.5-1.5B-Instruct`` has the files in the hub cache, not in a folder of
that name. :func:`resolve` turns such an id into the snapshot folder of the cache, through
``huggingface_hub.snapshot_download`` itself, so the cache's layout and its settings
(``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``) are the library's, not a copy of them.

The rules, in order:

1. a path that exists locally is used as is (a folder ``Org/Name`` in the working directory
   wins over the hub);
2. a value that is not shaped like a hub id (an absolute path, ``./x``, ``a/b/c``, a file name
   with a data suffix) is left alone: the caller reports it as missing;
3. a snapshot already in the cache is used without asking the hub (every role process of a
   run then sees the same commit, and starting needs no network);
4. otherwise, only when the caller allows it and ``HF_HUB_OFFLINE`` is not set, the snapshot
   is downloaded; else :class:`HubError` names the config key, the value and the
   ``hf download`` command to run.

Why a revision after ``@``: hub repo ids never contain ``@``, and the revision (a branch, a
tag or a commit) is what ``hf download --revision`` takes. Nothing here knows the config's
classes: the callers (``roles/launch/checks.py``) walk the config and pass each value with its key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

RepoType = Literal["model", "dataset"]

#: ``Org/Name`` with the hub's characters (letters, digits, ``_``, ``-``, ``.``; a part
#: starts and ends with a letter or digit, at most 96 characters), then ``@revision``.
_HUB_ID = re.compile(
    r"(?P<repo>[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?)"
    r"(?:@(?P<revision>[^\s@]+))?",
    re.ASCII,
)
#: Names ending like a file are local files the user forgot, not repos (``data/train.jsonl``).
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".csv", ".yaml", ".yml", ".txt", ".db")
#: A snapshot folder of the hub cache: ``<cache>/models--Org--Name/snapshots/<commit>``.
_SNAPSHOT = re.compile(r"(?:^|/)(?P<kind>models|datasets)--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[^/]+)/?$")


class HubError(ValueError):
    """A hub id that cannot be resolved; the message names the config key, the value and the
    command that fixes it, ready to be one line of a configuration error."""


@dataclass(frozen=True)
class HubId:
    """A parsed hub id: ``repo_id`` (``Org/Name``) and the revision, if one was given."""

    repo_id: str
    revision: str | None = None

    def download_command(self, repo_type: RepoType) -> str:
        """The command that puts this snapshot into the cache (``hf`` ships with the library)."""
        cmd = f"hf download {self.repo_id}"
        if repo_type == "dataset":
            cmd += " --repo-type dataset"
        if self.revision:
            cmd += f" --revision {self.revision}"
        return cmd


def parse_hub_id(value: str) -> HubId | None:
    """The hub id ``value`` names, or None when it is not shaped like one (see the module doc)."""
    m = _HUB_ID.fullmatch(value.strip())
    if m is None:
        return None
    repo = m.group("repo")
    if "--" in repo or ".." in repo or repo.lower().endswith(_FILE_SUFFIXES):
        return None  # the hub refuses "--" and ".." in ids
    return HubId(repo, m.group("revision"))


def hub_origin(path: str) -> str | None:
    """``Org/Name@commit`` when ``path`` is a snapshot folder of the hub cache, else None: lets
    a message about a resolved path also show what the user wrote."""
    m = _SNAPSHOT.search(path.replace("\\", "/"))
    if m is None:
        return None
    return f"{m.group('org')}/{m.group('name')}@{m.group('commit')}"


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) forbids the hub, as the
    library read it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    """The hub cache the library uses (``HF_HUB_CACHE``, else ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def not_cached_message(key: str, value: str, repo_type: RepoType) -> str:
    """The line for a hub id with no snapshot in the cache. It still starts with "does not
    exist": ``models/tiny`` may as well be a local folder the user forgot to build."""
    ref = parse_hub_id(value)
    cmd = ref.download_command(repo_type) if ref else f"hf download {value}"
    if offline():
        advice = f"HF_HUB_OFFLINE is set, nothing is downloaded: run `{cmd}`"
    else:
        advice = f"trinity run downloads it, or run `{cmd}`"
    return f"{key}: {value} does not exist: not a local path, nor a {repo_type} in the hub cache {cache_dir()} ({advice})"


def resolve(value: str, key: str, repo_type: RepoType = "model", *, download: bool = False) -> str:
    """The local path for config value ``value`` (config key ``key``): ``value`` itself when it
    exists or is no hub id, else the hub cache's snapshot folder of that id.

    ``download``: fetch a snapshot that is not cached (unless ``HF_HUB_OFFLINE``). The config
    loader resolves from the cache only (``trinity config`` must not fetch gigabytes); the
    commands that are about to use the input download it (``roles/launch/checks.py``: preflight).
    Raises :class:`HubError` when the id cannot be resolved."""
    if not value or Path(value).expanduser().exists():
        return value
    ref = parse_hub_id(value)
    if ref is None:
        return value
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return str(snapshot_download(ref.repo_id, repo_type=repo_type, revision=ref.revision,
                                     local_files_only=True))
    except HFValidationError:
        return value  # shaped like an id, but one the hub would refuse: a local path after all
    except LocalEntryNotFoundError:
        pass
    if not download or offline():
        raise HubError(not_cached_message(key, value, repo_type))
    try:
        return str(snapshot_download(ref.repo_id, repo_type=repo_type, revision=ref.revision))
    except Exception as e:  # noqa: BLE001 - whatever the download raised becomes one config line
        reason = (str(e).strip().splitlines() or [""])[0]
        raise HubError(f"{key}: {value} does not exist locally and downloading it from the hub "
                       f"failed ({type(e).__name__}: {reason}); check the id and your access, or "
                       f"run `{ref.download_command(repo_type)}` to see the whole error") from e
