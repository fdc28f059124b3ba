"""Certificates from an ACME CA (RFC 8555), obtained and renewed by the balancer.

- :mod:`.settings`   the ``[acme]`` table: directory, names, storage, challenges, renewal
- :mod:`.storage`    the folder: account key, certificate and key (0600), the ordering lock
- :mod:`.jws`        the account key and the signed requests (JWS ES256, RFC 7515/8555 §6.2)
- :mod:`.client`     the order flow: account, order, authorizations, finalize, download
- :mod:`.challenges` key authorizations, the TLS-ALPN-01 certificate, answering through the data plane
- :mod:`.renewal`    when to renew (a third of the lifetime left), backoff, the task that does it
"""

from balancer.acme.settings import LETS_ENCRYPT, LETS_ENCRYPT_STAGING, Acme

__all__ = ["LETS_ENCRYPT", "LETS_ENCRYPT_STAGING", "Acme"]
