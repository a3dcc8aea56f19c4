"""raftq.node: one broker process: HTTP routes and WebSocket streams over one broker service
over the Raft binding.

See DESIGN.md in this folder for the layers (``app`` assembles; ``topics``, ``messages``,
``ops``, ``stream`` are the route tables; ``routes``, ``httpio``, ``proxy``, ``openapi`` the HTTP
plumbing; ``service`` the broker service; ``commands``, ``codec``, ``errors`` pure) and the rest
(``batcher``, ``metrics``, ``local``, ``server``, ``devcluster``, ``cli``, ``bench``).
"""
