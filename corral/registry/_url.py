"""Registry URLs and connection options (pure: :func:`open_registry` opens them).

Accepted URLs::

    memory://                                       a fresh in-process MemoryRegistry
    sqlite:///abs/path/registry.db[?poll_interval=0.05&synchronous=full]
    etcd://host:port[,host:port...][/?prefix=<namespace>]
    etcds://host:port[,host:port...][/?prefix=<namespace>]   etcd over TLS

How to prove who we are to etcd (TLS CA, client certificate, user and password)
is not part of the URL: it comes as :class:`RegistryOptions`, so no secret is
ever in a URL that gets logged.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, unquote

from corral.registry._errors import InvalidRegistryUrl, RegistryAuthError

ACCEPTED_URLS = (
    "memory://, sqlite:///absolute/path/registry.db, etcd://host:port[,host:port...]"
    "[/?prefix=namespace/], etcds://... (the same, over TLS)"
)
MAX_PASSWORD_FILE = 4096

REGISTRY_FILE = "registry.db"


@dataclass(frozen=True, slots=True)
class RegistryUrl:
    """A parsed registry URL."""

    scheme: Literal["memory", "sqlite", "etcd"]
    path: str = ""
    endpoints: tuple[str, ...] = ()
    prefix: str = ""
    poll_interval: float | None = None
    synchronous: str | None = None
    tls: bool = False


@dataclass(frozen=True, slots=True)
class RegistryOptions:
    """How to connect to an etcd registry: TLS files and user/password auth.

    All optional; ``ca_file``, ``cert_file`` and ``key_file`` need an
    ``etcds://`` URL, and none of them applies to memory or SQLite. The
    password is left out of ``repr`` and of every message.

    Attributes:
        ca_file: PEM bundle of the CA(s) that signed etcd's certificate
            (default: the system's trusted CAs).
        cert_file: this client's certificate (PEM), when etcd requires one.
        key_file: the private key of ``cert_file`` (PEM).
        user: the etcd user to authenticate as.
        password: its password, or
        password_file: a file holding it (the first line; for secrets mounted as files).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    password_file: str | None = None

    @property
    def uses_tls_files(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file))

    @property
    def is_empty(self) -> bool:
        return not (self.uses_tls_files or self.user or self.password or self.password_file)

    def problems(self, url: RegistryUrl) -> list[str]:
        """What is wrong with these options for ``url`` (pure; empty when fine)."""
        found: list[str] = []
        if url.scheme != "etcd":
            if not self.is_empty:
                found.append(f"TLS and auth options apply to etcd only, not {url.scheme}")
            return found
        if self.uses_tls_files and not url.tls:
            found.append("a CA, certificate or key needs an etcds:// registry URL (TLS)")
        if bool(self.cert_file) != bool(self.key_file):
            found.append("a client certificate needs its key, and a key its certificate")
        if self.password is not None and self.password_file is not None:
            found.append("give the password or a password file, not both")
        has_password = self.password is not None or self.password_file is not None
        if has_password and not self.user:
            found.append("a password needs a user")
        if self.user and not has_password:
            found.append(f"user {self.user!r} needs a password (or a password file)")
        if self.user is not None and (not self.user.strip() or len(self.user) > 256):
            found.append("the user name must be 1 to 256 characters")
        return found

    def load_password(self) -> str | None:
        """The password, read from ``password_file`` when one is given.

        Raises:
            RegistryAuthError: the file cannot be read or is empty.
        """
        if self.password_file is None:
            return self.password
        try:
            with open(self.password_file, encoding="utf-8") as file:
                text = file.read(MAX_PASSWORD_FILE + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise RegistryAuthError(
                f"cannot read the registry password file {self.password_file}: "
                f"{exc.strerror if isinstance(exc, OSError) else 'not UTF-8'}; "
                "fix --registry-password-file"
            ) from None
        lines = text.splitlines()
        if len(text) > MAX_PASSWORD_FILE or not lines or not lines[0]:
            raise RegistryAuthError(
                f"the registry password file {self.password_file} is empty or longer than "
                f"{MAX_PASSWORD_FILE} bytes; put the password on its first line"
            )
        return lines[0]

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: ``ca_file`` (or the system CAs) and the client
        certificate, if any.

        Raises:
            RegistryAuthError: a file cannot be loaded; the message names it.
        """
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise RegistryAuthError(
                f"cannot load the registry CA file {self.ca_file}: {exc}; fix --registry-ca "
                "(a PEM file of the CA that signed etcd's certificate)"
            ) from None
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise RegistryAuthError(
                    f"cannot load the registry client certificate {self.cert_file} with key "
                    f"{self.key_file}: {exc}; fix --registry-cert / --registry-key (PEM files, "
                    "the key matching the certificate)"
                ) from None
        return context


def default_registry_url(data_dir: str | os.PathLike[str]) -> str:
    """The embedded default: ``sqlite:///<data_dir>/registry.db``."""
    return "sqlite://" + os.path.join(os.path.abspath(os.fspath(data_dir)), REGISTRY_FILE)


def _bad(url: str, why: str) -> InvalidRegistryUrl:
    return InvalidRegistryUrl(f"bad registry URL {url!r}: {why}; accepted: {ACCEPTED_URLS}")


def parse_registry_url(url: str) -> RegistryUrl:
    """Parse a registry URL.

    Raises:
        InvalidRegistryUrl: naming what is accepted.
    """
    if not isinstance(url, str):
        raise _bad(repr(url), "not a string")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad(url, "no scheme")
    rest, _, query_text = rest.partition("?")
    try:
        query = {k: v[-1] for k, v in parse_qs(query_text, strict_parsing=bool(query_text)).items()}
    except ValueError:
        raise _bad(url, f"cannot parse the query {query_text!r}") from None
    if scheme == "memory":
        if rest or query:
            raise _bad(url, "memory:// takes no path or options")
        return RegistryUrl("memory")
    if scheme == "sqlite":
        if not rest.startswith("/"):
            raise _bad(url, "the SQLite path must be absolute (three slashes: sqlite:///path)")
        unknown = set(query) - {"poll_interval", "synchronous"}
        if unknown:
            raise _bad(url, f"unknown SQLite options {sorted(unknown)}")
        poll: float | None = None
        if "poll_interval" in query:
            try:
                poll = float(query["poll_interval"])
            except ValueError:
                raise _bad(url, "poll_interval must be a number of seconds") from None
            if poll <= 0:
                raise _bad(url, "poll_interval must be > 0")
        synchronous = query.get("synchronous")
        if synchronous is not None and synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise _bad(url, "synchronous must be normal, full or extra")
        return RegistryUrl(
            "sqlite",
            path=unquote(rest),
            poll_interval=poll,
            synchronous=None if synchronous is None else synchronous.upper(),
        )
    if scheme in ("etcd", "etcds"):
        hosts, _, path = rest.partition("/")
        if path:
            raise _bad(url, "etcd URLs take no path; give a namespace as ?prefix=...")
        unknown = set(query) - {"prefix"}
        if unknown:
            raise _bad(url, f"unknown etcd options {sorted(unknown)}")
        endpoints = tuple(h for h in hosts.split(","))
        if "@" in hosts:  # never echo it: it may hold a password
            raise _bad(
                f"{scheme}://<credentials hidden>@...",
                "credentials do not go in the URL; give --registry-user and "
                "--registry-password (or --registry-password-file)",
            )
        for endpoint in endpoints:
            host, colon, port = endpoint.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise _bad(url, f"endpoint {endpoint!r} is not host:port")
        return RegistryUrl(
            "etcd", endpoints=endpoints, prefix=query.get("prefix", ""), tls=scheme == "etcds"
        )
    raise _bad(url, f"unknown scheme {scheme!r}")
