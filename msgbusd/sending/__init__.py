"""How a message leaves the site: one peer per destination twin (its health, its sender, batching, signing),
over a link (:mod:`msgbusd.link`) or in POSTs, and the durable schedule of re-sends, give-ups and expiry.

May import from msgbusd: errors, reports, identity, store, link.
"""
