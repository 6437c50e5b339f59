"""A site made and run: settings, the ``msgbusd`` command line, ``open_site`` and the daemon, the work in
flight, the companions beside it (the rules router), ``GET /status`` and how uvicorn serves.

May import from msgbusd: errors, reports, identity, store, link, sending, door.
"""
