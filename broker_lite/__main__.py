"""``python -m broker_lite [--host H] [--port P] [--role write|read|both] [--kafka-port K]`` (also
``llog broker``): serve the broker with uvicorn (uvloop and httptools; one process, one event loop, so
every request shares one group commit). Settings come from ``Config`` (``LLOG_*`` variables, or
the local stack's settings file). Without ``LLOG_BROKER_AUTH`` the broker listens on loopback
only, unless ``--insecure``."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from broker_lite.app import ROLES, BrokerApp
from broker_lite.auth import Auth, check_exposure
from llog.config import Config
from llog.errors import LlogError

#: Seconds the server waits for requests in flight when it is stopped (SIGINT/SIGTERM).
GRACEFUL_SHUTDOWN_S = 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker_lite", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    parser.add_argument("--role", choices=list(ROLES), default=None,
                        help="write (produce), read (consume, groups) or both (default: LLOG_BROKER_ROLE, else both)")
    parser.add_argument("--kafka-port", type=int, help="also serve Kafka clients on this port (docs/kafka.md)")
    parser.add_argument("--kafka-advertised-host", help="the host the Kafka listener names in its metadata answers, "
                                                       "which clients connect to (default: --host)")
    parser.add_argument("--insecure", action="store_true",
                        help="listen on a non-loopback address without LLOG_BROKER_AUTH (anyone may do anything)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = Config.load()
        auth = Auth.load(config.broker_auth)
        check_exposure(args.host, auth, args.insecure)
        app = BrokerApp(config, args.host, args.port, role=args.role, auth=auth, kafka_port=args.kafka_port,
                        kafka_advertised_host=args.kafka_advertised_host)
    except LlogError as e:
        print(f"broker_lite: {e}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", lifespan="on",
                log_level=args.log_level, access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
