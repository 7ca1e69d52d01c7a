"""The ``llog stack install|up|down|status`` command (``python -m llog_tools stack ...``): its
options, and what it prints; the work is :mod:`llog_tools.local_stack`'s."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llog import config
from llog.errors import ConfigError, LlogError
from llog_tools.local_stack import down, status, up
from llog_tools.stack.brokers import BROKER_PORT_ENV, DEFAULT_BROKER_PORT, broker_port_from_env
from llog_tools.stack.build import install
from llog_tools.stack.haproxy import PARTITION_HEADER
from llog_tools.stack.network import DEFAULT_PORTS, HOST, PORT_LABELS, port_env, resolve_ports
from llog_tools.stack.oxia_server import OXIA_CLUSTER_SHARDS


def add_stack_command(subparsers) -> None:
    """Add ``stack install|up|down|status`` to an argparse subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--stack-dir", type=Path, default=None,
                        help="state directory (default: $LLOG_STACK_DIR or <llog home>/stack)")
    stack = subparsers.add_parser(
        "stack", help="run a local Oxia + S3 (versitygw) stack",
        description="Run a local Oxia + S3 (versitygw) stack on 127.0.0.1 for development and tests.",
    )
    actions = stack.add_subparsers(dest="stack_action", metavar="{install,up,down,status}", required=True)

    install_parser = actions.add_parser("install", help="build the Oxia and versitygw binaries (idempotent)")
    install_parser.set_defaults(func=_cmd_install)

    up_parser = actions.add_parser("up", parents=[common], help="install, start and wait until healthy")
    for name, label in PORT_LABELS.items():
        up_parser.add_argument(
            f"--{name.replace('_', '-')}-port", dest=f"{name}_port", type=int, metavar="PORT",
            help=f"{label} port (default: ${port_env(name)} or {getattr(DEFAULT_PORTS, name)})",
        )
    up_parser.add_argument("--bucket", default="llog", help="S3 bucket to create (default: llog)")
    up_parser.add_argument("--oxia-cluster", action="store_true",
                           help="run Oxia as a replicated cluster: a coordinator and 3 servers, replication factor 3 "
                                "(the --oxia-port and --oxia-metrics-port are the first server's)")
    up_parser.add_argument("--oxia-shards", type=int, default=OXIA_CLUSTER_SHARDS, metavar="N",
                           help=f"shards of a new Oxia cluster's namespace (default: {OXIA_CLUSTER_SHARDS})")
    up_parser.add_argument("--broker", action="store_true",
                           help=f"also start an HTTP broker (python -m broker_lite) on 127.0.0.1 "
                                f"(port: --broker-port, else ${BROKER_PORT_ENV} or {DEFAULT_BROKER_PORT})")
    up_parser.add_argument("--broker-port", type=int, metavar="PORT", default=None)
    up_parser.add_argument("--kafka-port", type=int, metavar="PORT", default=None,
                           help="with --broker: its Kafka listener on this port, for Kafka clients (docs/kafka.md); "
                                "with --brokers N: broker i's listener on PORT+i (not with --split-roles)")
    up_parser.add_argument("--brokers", type=int, metavar="N", default=None,
                           help="start N brokers on ports of their own behind HAProxy, which listens on the broker "
                                f"port and sends each topic-partition (header {PARTITION_HEADER}: topic/partition) "
                                "to one broker (docs/brokers.md)")
    up_parser.add_argument("--split-roles", action="store_true",
                           help="with --brokers N: half (rounded up) write brokers, which get /produce, the rest read "
                                "brokers, which get /consume, sharing one tail cache directory")
    up_parser.add_argument("--timeout", type=float, default=90, help="seconds to wait for health (default: 90)")
    up_parser.set_defaults(func=_cmd_up)

    down_parser = actions.add_parser("down", parents=[common], help="stop the stack")
    down_parser.add_argument("--purge", action="store_true", help="also delete the stack's data")
    down_parser.set_defaults(func=_cmd_down)

    status_parser = actions.add_parser("status", parents=[common], help="show whether the stack runs")
    status_parser.add_argument("--json", action="store_true", help="print the status as JSON")
    status_parser.set_defaults(func=_cmd_status)


def _cmd_install(args: argparse.Namespace) -> int:
    try:
        binaries = install()
    except LlogError as e:
        print(f"llog stack install: {e}", file=sys.stderr)
        return 1
    for name, path in binaries.items():
        print(f"{name}: {path}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    try:
        ports = resolve_ports({name: getattr(args, f"{name}_port") for name in PORT_LABELS})
        if args.brokers is not None and args.brokers < 1:
            raise ConfigError(f"--brokers {args.brokers}: at least 1")
        if args.split_roles and args.brokers is None:
            raise ConfigError("--split-roles goes with --brokers N")
        if args.broker and args.brokers is not None:
            raise ConfigError("--broker is one broker without a balancer; --brokers N is N behind one: choose one")
        broker_port = None
        if args.broker or args.broker_port or args.brokers is not None or args.kafka_port is not None:
            broker_port = args.broker_port or broker_port_from_env()
        info = up(args.stack_dir, ports=ports, bucket=args.bucket, timeout_s=args.timeout, broker_port=broker_port,
                  oxia_cluster=args.oxia_cluster, oxia_shards=args.oxia_shards, brokers=args.brokers,
                  split_roles=args.split_roles, kafka_port=args.kafka_port)
    except LlogError as e:
        print(f"llog stack up: {e}", file=sys.stderr)
        return 1
    print_status(info)
    print("stop it with: llog stack down")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    try:
        stopped = down(args.stack_dir, purge=args.purge)
    except LlogError as e:
        print(f"llog stack down: {e}", file=sys.stderr)
        return 1
    print("stopped " + ", ".join(stopped) if stopped else "nothing was running")
    if args.purge:
        print(f"deleted the stack's data in {args.stack_dir or config.stack_dir()}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        info = status(args.stack_dir)
    except LlogError as e:
        print(f"llog stack status: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print_status(info)
    return 0


def print_status(info: dict) -> None:
    oxia, s3 = info["oxia"], info["s3"]
    cluster = oxia.get("cluster")
    oxia_processes = [cluster["coordinator"], *cluster["servers"]] if cluster else [oxia]
    if not (any(p["pid"] for p in oxia_processes) or s3["pid"]):
        print(f"local stack is not running (stack dir {info['stack_dir']})")
        return
    print(f"local stack is {'running' if info['running'] else 'NOT healthy'} (stack dir {info['stack_dir']})")
    if cluster is None:
        print(f"  oxia       {_health(oxia)}  pid {oxia['pid'] or '-'}  {oxia['service_address']}"
              f"  (metrics port {oxia['metrics_port']})")
    else:
        print(f"  oxia       {'healthy' if oxia['healthy'] else 'unhealthy'}  cluster of {len(cluster['servers'])} "
              f"servers, {cluster['shards']} shards, replication factor {cluster['replication_factor']}  "
              f"{oxia['service_address']}")
        coordinator = cluster["coordinator"]
        print(f"    {coordinator['name']:<17} pid {_pid(coordinator)}  {coordinator['internal']}"
              f"  (metrics port {coordinator['metrics_port']})")
        for server in cluster["servers"]:
            print(f"    {server['name']:<17} pid {_pid(server)}  {server['public']}  leads {server['leads']}, follows "
                  f"{server['follows']}  (internal {server['internal']}, metrics port {server['metrics_port']})")
    print(f"  s3         {_health(s3)}  pid {s3['pid'] or '-'}  {s3['endpoint_url']}  bucket {s3['bucket']}"
          f"  ({s3['server']}, data in {s3['data']})")
    broker = info.get("broker")
    if broker and "balancer" in broker:
        balancer = broker["balancer"]
        print(f"  balancer   {_health(broker)}  pid {broker['pid'] or '-'}  {broker['url']}  (HAProxy, route by "
              f"{balancer['route_header']}{', split roles' if balancer['split_roles'] else ''}; stats "
              f"{balancer['stats_url']}, config {balancer['config']})")
        if broker.get("kafka_bootstrap"):
            print(f"  Kafka bootstrap {broker['kafka_bootstrap']}  (every broker's listener, no balancer)")
        for b in info.get("brokers", []):
            print(f"    {b['name']:<17} {_health(b)}  pid {_pid(b)}  {b['url']}  role {b['role']}"
                  + (f"  Kafka {HOST}:{b['kafka_port']}" if b.get("kafka_port") is not None else ""))
    elif broker:
        print(f"  broker     {_health(broker)}  pid {broker['pid'] or '-'}  {broker['url']}"
              + (f"  Kafka bootstrap {broker['kafka_bootstrap']}" if broker.get("kafka_bootstrap") else ""))
    print(f"  settings   {info['settings_file']}")


def _pid(process: dict) -> str:
    if not process["pid"]:
        return "- (stopped)"
    return f"{process['pid']} (paused)" if process["paused"] else str(process["pid"])


def _health(service: dict) -> str:
    if not service["pid"]:
        return "stopped"
    return "healthy" if service["healthy"] else "unhealthy"
