"""msgbusd, the RMB site daemon, in rooms by role (bottom to top; a room imports only rooms below it):

- ``reports``: what a site tells its operator: logs, metrics, the event log, recent traffic, peer activity;
- ``identity``: the site's key and RMB signatures;
- ``store``: the site's Redis: every hand-off in one script, the backlog, the send queues;
- ``sending``: how a message leaves the site: peers, their health, links and POSTs, the retry schedule;
- ``door``: how a message comes in: the HTTP endpoints and their checks, the system queues' handlers;
- ``site``: settings, the command line, a site made and run, companions, ``/status``;
- ``gateway``: ``msgbus gateway``, RMB's HTTP proxy, a program of its own.

``errors`` (the exceptions every room raises) sits beside the rooms and imports none of them; so does
``command``, the ``msgbusd`` command, which says what to install when the daemon's packages are missing.
"""
