"""What a site reports: its logs, Prometheus metrics, the event log, the last minute of traffic and what
each peer did last. Everything else writes here; nothing here knows who writes.

May import from msgbusd: nothing.
"""
