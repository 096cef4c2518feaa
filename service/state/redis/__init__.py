"""The Redis run bus (`AGW_RUN_BUS=redis`): the live runs of every replica, through Redis.

`bus.py` (`RedisRunBus`) composes the parts, a module each; its docstring maps them.
"""
