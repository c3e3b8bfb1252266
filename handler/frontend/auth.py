"""The bearer key: from a file (re-read when the file changes: rotation is rewriting it) or an
environment variable; compared in constant time; never expires by itself."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

KEY_ENV = "INF2_API_KEY"  # the key itself (an alternative to --key-file)
KEY_BYTES = 32  # a generated key: 256 bits, URL-safe base64


class BearerKey:
    """`Authorization: Bearer <key>` checks against the current key. With a file, its content
    (stripped) is the key, read again whenever its modification time, size or inode changes, so
    a rotation takes effect with the next request and needs no restart."""

    def __init__(self, path: Path | None = None, value: str | None = None) -> None:
        if (path is None) == (value is None):
            raise ValueError("a key needs exactly one of a file or a value")
        self.path = path
        self._value = value.strip().encode() if value is not None else b""
        self._stamp: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        if value is not None and not self._value:
            raise ValueError(f"{KEY_ENV} is empty")
        if path is not None:
            self._reload()

    @classmethod
    def from_file_or_env(cls, path: Path | None, generate: bool = True) -> BearerKey:
        """The key of `path` (written with a fresh key, mode 0600, when absent and `generate`), else
        of $INF2_API_KEY."""
        if path is None:
            value = os.environ.get(KEY_ENV)
            if value is None:
                raise ValueError(f"no key: pass --key-file or set {KEY_ENV} (or --no-auth)")
            return cls(value=value)
        if not path.exists() and generate:
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(secrets.token_urlsafe(KEY_BYTES) + "\n")
            logger.info("wrote a new API key to %s", path)
        return cls(path=path)

    def _reload(self) -> None:
        assert self.path is not None
        info = self.path.stat()
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if stamp == self._stamp:
            return
        value = self.path.read_text().strip().encode()
        if not value:  # mid-write (created, not yet written): keep the old key until the new one is there
            if not self._value:
                raise ValueError(f"the key file {self.path} is empty")
            return
        self._value, self._stamp = value, stamp

    def current(self) -> bytes:
        if self.path is not None:
            with self._lock:
                try:
                    self._reload()
                except (OSError, ValueError):  # a rotation in progress: the last key read stays valid
                    logger.warning("could not read the key file %s; the last key read stays", self.path)
        return self._value

    def accepts(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries the key (constant-time comparison)."""
        if not authorization:
            return False
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self.current())
