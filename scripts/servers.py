"""Throwaway PostgreSQL and Redis for trying the shared state: `scripts/servers.py`.

Starts one of each on free loopback ports (`service.testing.servers`: temporary
directories, nothing made durable), creates the database `agw`, prints one line of
shell to use them —

    export AGW_POSTGRES_DSN=postgresql://postgres@127.0.0.1:41234/agw AGW_REDIS_URL=redis://127.0.0.1:40321/0

— and keeps them until Ctrl-C or SIGTERM, then stops both and removes their data.
The binaries are Debian's `postgresql` and `redis-server` (`make install`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from service.testing import PostgresServer, RedisServer, ServerUnavailable


def main() -> int:
    argparse.ArgumentParser(description=__doc__).parse_args()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with PostgresServer.start() as postgres, RedisServer.start() as redis:
            dsn = postgres.create_database("agw")
            print(f"export AGW_POSTGRES_DSN={dsn} AGW_REDIS_URL={redis.url}", flush=True)
            print("PostgreSQL and Redis are up; Ctrl-C stops them", file=sys.stderr, flush=True)
            stop.wait()
    except ServerUnavailable as error:
        print(f"servers.py: {error}", file=sys.stderr)
        return 1
    print("PostgreSQL and Redis stopped, their data removed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
