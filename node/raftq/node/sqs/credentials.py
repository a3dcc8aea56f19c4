"""SQS credentials for raftq tokens (pure).

A raftq token is ``rq_<id>.<secret>`` and the replicated state keeps only the SHA-256 of its
secret, so no node could check an HMAC keyed by the secret itself. Instead, a token's *SQS
secret access key* is derived, on any node, from the cluster's key and what the state keeps:

    access key id     = the token's id (``admin`` for the bootstrap admin token)
    secret access key = base64(HMAC-SHA256(sqs_key, "raftq-sqs-v1" 0 id 0 sha256(secret)))[:40]

where ``sqs_key`` is itself derived from the cluster secret (``node_key``). Only a node can
compute it; a token holder asks one for its own (``GET /sqs/credentials``, ``raftq sqs
credentials``). The SQS key dies with its token (revoked, disabled, expired: the lookup fails)
and leaking it does not leak the token: it signs SQS requests only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

LABEL = b"raftq-sqs-v1"


def node_key(cluster_key: str) -> bytes:
    """The key SQS secrets are derived from (the same on every node of a cluster)."""
    return hmac.new(cluster_key.encode(), b"raftq-sqs-key-v1", hashlib.sha256).digest()


def secret_access_key(key: bytes, token_id: str, token_hash: bytes) -> str:
    msg = LABEL + b"\0" + token_id.encode() + b"\0" + token_hash
    return base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode()[:40]
