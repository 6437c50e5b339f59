"""The link between two msgbus sites: one long-lived WebSocket, opened by either site, that carries envelopes
both ways. Its handshake and the admission of handshakes, its frames and the parts of large ones, the writer
that puts small frames before parts and the pace it writes at, keepalive and pings, the site's end of the
socket, how far each peer's clock is, and the HTTP clients that links and POSTs share.

May import from msgbusd: errors, reports, identity, store.
"""
