"""How a message comes into the site: from other sites through the HTTP endpoints (their checks, rate
limits, the OpenAPI document, the ``/zbus-link`` upgrade), and from local apps and services through the
handlers of the system queues.

May import from msgbusd: errors, reports, identity, store, link, sending.
"""
