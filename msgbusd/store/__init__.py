"""The site's Redis: every hand-off as one script that does nothing the second time, the backlog, each
destination's send queue, and many scripts in one round trip.

May import from msgbusd: nothing.
"""
