"""HTTPS for the HTTP clients: which server certificates to trust, and the client's own.

Every client (`RemoteStore`, `AsyncRemoteStore`, `RemotePubSub`) takes the same keywords:

- nothing: an `https://` URL is verified against httpx's default trust (certifi's CAs, or the
  file in `$SSL_CERT_FILE` / the directory in `$SSL_CERT_DIR` when set);
- `cafile="ca.pem"`: trust only the CAs in that PEM file (a private CA, as `curl --cacert`);
- `certfile=` (and `keyfile=` when the key is in a file of its own): present this client
  certificate, for a server started with `--tls-client-ca`;
- `ssl_context=`: an `ssl.SSLContext` of your own, for anything else (then none of the above).

Certificates are always verified, host name included: turning that off takes a context made
for it. A bad file is refused when the client is made, not at its first request.
"""

from __future__ import annotations

import ssl

from dirmq.errors import InvalidArgument

# httpx's own default when no TLS keyword is given.
DEFAULT_VERIFY = True


def verify_argument(
    cafile: str | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> ssl.SSLContext | bool:
    """What the httpx client's `verify=` gets from the client's TLS keywords."""
    if ssl_context is not None:
        if cafile or certfile or keyfile:
            raise InvalidArgument(
                "give either ssl_context or cafile/certfile/keyfile, not both "
                "(load them into the context)"
            )
        return ssl_context
    if keyfile is not None and certfile is None:
        raise InvalidArgument("keyfile needs certfile (the client certificate it belongs to)")
    if cafile is None and certfile is None:
        return DEFAULT_VERIFY
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"cannot use cafile {cafile}: {_reason(exc)}") from None
    if certfile is not None:
        try:
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:
            files = certfile if keyfile is None else f"{certfile} with keyfile {keyfile}"
            raise InvalidArgument(f"cannot use certfile {files}: {_reason(exc)}") from None
    return context


def hint(reason: str) -> str:
    """A few words on what to do about a TLS failure whose text is `reason`, or ''."""
    if "CERTIFICATE_VERIFY_FAILED" in reason:
        return " (give cafile= the CA that signed the server's certificate)"
    if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason:
        return " (the server wants a client certificate: certfile=, keyfile=)"
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason:
        return " (is it a plain HTTP server? then use an http:// URL)"
    return ""


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    return f"{exc.strerror or exc}"
