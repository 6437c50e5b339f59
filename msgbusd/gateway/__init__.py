"""``msgbus gateway``: RMB's HTTP proxy for clients without a site of their own, a program of its own that
serves as the site does.

May import from msgbusd: errors, reports, site.
"""
