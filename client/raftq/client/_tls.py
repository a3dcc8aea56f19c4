"""The clients' TLS context from ``ca=``, ``cert=`` and ``key=`` (both clients, the CLI).

``ca``: a CA file (PEM) to verify nodes with instead of the system's store, or a ready
``ssl.SSLContext`` used as it is (put a client certificate in it yourself); ``cert`` / ``key``: a
client certificate (PEM; ``key`` may be left out when ``cert`` holds the key too), for nodes
that require one. Nothing given: None, and ``https://`` URLs are verified against the system's
store. Certificates and host names are always checked, TLS 1.2 at least (Python's defaults).
"""

from __future__ import annotations

import os
import ssl

CA = str | os.PathLike[str] | ssl.SSLContext


def client_context(
    ca: CA | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext | None:
    """The context for ``https://`` URLs (``ValueError`` for a file that does not load)."""
    if isinstance(ca, ssl.SSLContext):
        if cert is not None or key is not None:
            raise ValueError(
                "cert= and key= go with a CA file, not an SSLContext: load the client"
                " certificate into the context (load_cert_chain)"
            )
        return ca
    if ca is None and cert is None and key is None:
        return None
    if key is not None and cert is None:
        raise ValueError("key= needs cert= (the client certificate)")
    try:
        ctx = ssl.create_default_context(cafile=None if ca is None else os.fspath(ca))
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"ca: cannot load {os.fspath(ca or '')}: {_why(e)}") from None
    if cert is not None:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            where = os.fspath(cert) if key is None else f"{os.fspath(cert)}, {os.fspath(key)}"
            raise ValueError(f"cert/key: cannot load {where}: {_why(e)}") from None
    return ctx


def _why(e: OSError) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    return e.strerror or str(e)
