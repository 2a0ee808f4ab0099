"""TLS for every listener: the server's `ssl.SSLContext`, built and checked once at start.

`dirmq serve --tls-cert FILE --tls-key FILE [--tls-client-ca FILE]` serves HTTPS on every
listener (native, yaq, SQS) with Python's `ssl` under uvloop. The context is built in the parent
before anything is bound or announced, so a missing, unreadable, malformed or mismatched file
stops the start with one line that names the option and the file; forked workers inherit it
(and with it the session-ticket keys, so a client resumes its session on any worker).

Defaults: TLS 1.2 at least, the ciphers of `ssl.create_default_context(Purpose.CLIENT_AUTH)`,
no renegotiation, ALPN `http/1.1` (the only protocol served). With `--tls-client-ca`, every
client must present a certificate that this CA signed (the system's CAs are not trusted for
clients: only that file). A certificate that does not verify fails the handshake; a client that
presents none completes it (CERT_OPTIONAL) only to be answered 403, saying why, before anything
it sends is read (`http.py`): a failed handshake would show it nothing but a closed connection,
as uvloop sends no TLS alert when a handshake fails.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass

from dirmq.errors import InvalidArgument

_CERTIFICATE_PEM = b"-----BEGIN CERTIFICATE-----"
_KEY_PEM_END = b"PRIVATE KEY-----"  # PRIVATE KEY, RSA/EC PRIVATE KEY, ENCRYPTED PRIVATE KEY
MAX_PEM_BYTES = 1024 * 1024  # a certificate chain or a key is a few KiB


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str  # PEM: the server's certificate, then any intermediates
    key: str  # PEM: its private key, unencrypted
    client_ca: str | None = None  # PEM: CAs whose client certificates are required


def tls_files(cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
    """The TLS files from the options (None: plain HTTP); InvalidArgument for a partial set."""
    if cert is None and key is None:
        if client_ca is not None:
            raise InvalidArgument(
                "--tls-client-ca needs --tls-cert and --tls-key (client certificates are "
                "asked for during a TLS handshake)"
            )
        return None
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise InvalidArgument(f"{given} needs {missing} too (the certificate and its key)")
    return TlsFiles(cert, key, client_ca)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """The context every listener serves with; InvalidArgument says in one line which file is
    wrong and how."""
    cert = _read_pem("--tls-cert", files.cert)
    if _CERTIFICATE_PEM not in cert:
        raise InvalidArgument(f"--tls-cert {files.cert} holds no PEM certificate")
    key = _read_pem("--tls-key", files.key)
    if _KEY_PEM_END not in key:
        raise InvalidArgument(f"--tls-key {files.key} holds no PEM private key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["http/1.1"])
    asked_password = False

    def no_password() -> bytes:
        # Called only for an encrypted key: no prompt on a terminal, a clear refusal below.
        nonlocal asked_password
        asked_password = True
        return b""

    try:
        context.load_cert_chain(files.cert, files.key, password=no_password)
    except ssl.SSLError as exc:
        if asked_password:
            raise InvalidArgument(
                f"--tls-key {files.key} is encrypted with a passphrase; dirmq needs it "
                f"unencrypted (e.g. openssl pkey -in {files.key} -out server.key, kept mode 0600)"
            ) from None
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise InvalidArgument(
                f"--tls-key {files.key} is not the private key of the certificate in "
                f"--tls-cert {files.cert}"
            ) from None
        if not _certificates_load(files.cert):
            raise InvalidArgument(
                f"--tls-cert {files.cert} holds a damaged PEM certificate ({_reason(exc)})"
            ) from None
        raise InvalidArgument(
            f"--tls-key {files.key} holds a damaged or unsupported private key ({_reason(exc)})"
        ) from None
    if files.client_ca is not None:
        if _CERTIFICATE_PEM not in _read_pem("--tls-client-ca", files.client_ca):
            raise InvalidArgument(f"--tls-client-ca {files.client_ca} holds no PEM certificate")
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except ssl.SSLError as exc:
            raise InvalidArgument(
                f"--tls-client-ca {files.client_ca} holds a damaged PEM certificate "
                f"({_reason(exc)})"
            ) from None
        context.verify_mode = ssl.CERT_OPTIONAL  # a certificate given is verified; none: 403
    return context


def requires_client_certificate(context: ssl.SSLContext | None) -> bool:
    """Whether connections without a client certificate are to be refused (`--tls-client-ca`)."""
    return context is not None and context.verify_mode != ssl.CERT_NONE


def _certificates_load(path: str) -> bool:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError:
        return False
    return True


def _read_pem(option: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(MAX_PEM_BYTES)
    except OSError as exc:
        raise InvalidArgument(f"cannot read {option} {path}: {exc.strerror or exc}") from None


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's words ("PEM lib", "NO_START_LINE"...) without the C source location."""
    text = re.sub(r"^\[\w+\] | \(_ssl\.c:\d+\)$", "", str(exc.reason or exc.strerror or exc))
    return text.replace("_", " ").lower()
