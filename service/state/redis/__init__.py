"""The Redis run bus (`AGW_RUN_BUS=redis`): the live runs of every replica, through Redis."""
