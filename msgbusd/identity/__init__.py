"""Who a site is: its key, made from the ``--mnemonics`` secret, and RMB envelope signatures (signing ours,
verifying a peer's).

May import from msgbusd: nothing.
"""
