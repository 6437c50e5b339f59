"""What every part of msgbus speaks: the RMB envelope, the Redis keys and lists, the RMB error texts, and
how a Redis list is consumed without losing an item. It imports nothing else of msgbus."""
