"""`gpugeek services …`: inference services from the command line (list, get, create,
scale, autoscale, events, logs, rollback, delete, token), over `client.services`."""

from __future__ import annotations

import argparse
import sys
import time

from gpugeek import output
from gpugeek.client import Client
from gpugeek.errors import UsageError
from gpugeek.spec import parse_env, parse_volume

SERVICE_COLUMNS = ["id", "name", "status", "revision", "ready_replicas", "replicas",
                   "min_replicas", "max_replicas", "endpoint_url"]  # fmt: skip
REPLICA_COLUMNS = ["id", "revision", "state", "reason", "started_at", "ready_at"]
EVENT_COLUMNS = ["at", "from_replicas", "to_replicas", "window", "stable_value", "panic_value",
                 "held_requests", "cold_start_seconds"]  # fmt: skip


def add_parser(sub) -> None:
    services = sub.add_parser("services", help="inference services (endpoints that scale)")
    actions = services.add_subparsers(dest="services_command", required=True, metavar="ACTION")
    actions.add_parser("list", help="list the organisation's services")
    get = actions.add_parser("get", help="show the service ID and its replicas")
    get.add_argument("id", type=int)
    create = actions.add_parser("create", help="create a service: NAME --image … -- COMMAND")
    create.add_argument("name")
    create.add_argument("--image", required=True)
    create.add_argument("--port", type=int, required=True, help="where the server listens")
    create.add_argument("--region", required=True)
    create.add_argument("--cpus", type=int, default=1)
    create.add_argument("--gpu-type", help="GPU replicas of this type (a slug, e.g. h100), on "
                        "the region's cluster")  # fmt: skip
    create.add_argument("--gpus", type=int, default=0, dest="gpus_per_replica",
                        help="GPUs per replica (1 by default with --gpu-type)")  # fmt: skip
    create.add_argument("--min-replicas", type=int, default=2, help="0 scales to zero when idle")
    create.add_argument("--max-replicas", type=int, default=10)
    create.add_argument("--readiness-path", default="/", help="GET here answers 2xx when ready")
    create.add_argument("--env", action="append", metavar="KEY=VALUE", default=[])
    create.add_argument("--secret", action="append", metavar="NAME", default=[], dest="secrets",
                        help="an organisation secret for the replicas' environment")  # fmt: skip
    create.add_argument("--volume", action="append", metavar="NAME:/PATH", default=[],
                        dest="volumes", help="a volume every replica mounts read-only "
                        "(repeatable), e.g. weights:/models")  # fmt: skip
    create.add_argument("--public", action="store_true", help="no service token needed to call it")
    create.add_argument("--priority", choices=("critical", "normal", "low"), default="normal",
                        help="critical keeps serving when a budget is used up")  # fmt: skip
    create.add_argument("--autoscale", metavar="METRIC=TARGET", type=_autoscale,
                        help="concurrency=10 (in flight per replica) or rps=5")  # fmt: skip
    create.add_argument("argv", nargs="+", metavar="-- COMMAND", help="the server's command")
    scale = actions.add_parser("scale", help="set the replica range of the service ID")
    scale.add_argument("id", type=int)
    scale.add_argument("--min", type=int, required=True, dest="min_replicas")
    scale.add_argument("--max", type=int, required=True, dest="max_replicas")
    autoscale = actions.add_parser("autoscale", help="what the service ID scales on")
    autoscale.add_argument("id", type=int)
    autoscale.add_argument("autoscale", metavar="METRIC=TARGET", type=_autoscale,
                           help="concurrency=10 or rps=5 (per replica), or cpu=70 or gpu=70 "
                           "(percent, on a cluster)")  # fmt: skip
    autoscale.add_argument("--scale-down-delay", type=int, metavar="SECONDS",
                           help="how long the traffic must want fewer replicas before one "
                           "goes (default 300)")  # fmt: skip
    events = actions.add_parser(
        "events", help="the latest scaling decisions of the service ID (newest first)"
    )
    events.add_argument("id", type=int)
    logs = actions.add_parser("logs", help="the latest log lines of the service ID's replicas")
    logs.add_argument("id", type=int)
    logs.add_argument("--replica", type=int, help="only this replica (default: every one)")
    logs.add_argument("--tail", type=int, default=100, help="lines per replica (default 100)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new lines (every 2 s) until Ctrl-C")  # fmt: skip
    rollback = actions.add_parser("rollback", help="run revision REVISION of the service again")
    rollback.add_argument("id", type=int)
    rollback.add_argument("revision", type=int)
    delete = actions.add_parser("delete", help="delete the service ID (its endpoint goes)")
    delete.add_argument("id", type=int)
    delete.add_argument("--yes", action="store_true", help="don't ask for confirmation")
    token = actions.add_parser("token", help="create an endpoint token NAME (shown once)")
    token.add_argument("id", type=int)
    token.add_argument("token_name", metavar="NAME")


def run(args: argparse.Namespace, client: Client) -> None:
    action = args.services_command
    services = client.services
    if action == "list":
        rows = [service.to_dict() for service in services.list()]
        output.dump(rows) if args.json else output.table(rows, SERVICE_COLUMNS)
    elif action == "get":
        service = services.get(args.id).to_dict()
        replicas = [replica.to_dict() for replica in services.replicas(args.id)]
        if args.json:
            output.dump({**service, "replica_list": replicas})
        else:
            output.pairs(service)
            print()
            output.table(replicas, REPLICA_COLUMNS)
    elif action == "create":
        service = services.create(
            args.name, image=args.image, command=list(args.argv), port=args.port,
            region=args.region, cpus=args.cpus, min_replicas=args.min_replicas,
            max_replicas=args.max_replicas, readiness_path=args.readiness_path,
            env=parse_env(args.env), auth="public" if args.public else "token",
            autoscale=args.autoscale, priority=args.priority, secrets=args.secrets,
            volumes=[_volume(text) for text in args.volumes], gpu_type=args.gpu_type,
            gpus_per_replica=args.gpus_per_replica,
        )  # fmt: skip
        output.dump(service.to_dict()) if args.json else output.pairs(service.to_dict())
    elif action == "scale":
        service = services.scale(
            args.id, min_replicas=args.min_replicas, max_replicas=args.max_replicas
        )
        output.dump(service.to_dict()) if args.json else output.pairs(service.to_dict())
    elif action == "autoscale":
        service = services.autoscale(
            args.id, **args.autoscale, scale_down_delay=args.scale_down_delay
        )
        output.dump(service.to_dict()) if args.json else output.pairs(service.to_dict())
    elif action == "events":
        rows = [event.to_dict() for event in services.scale_events(args.id)]
        output.dump(rows) if args.json else output.table(rows, EVENT_COLUMNS)
    elif action == "logs":
        _logs(args, services)
    elif action == "rollback":
        service = services.rollback(args.id, args.revision)
        output.dump(service.to_dict()) if args.json else output.pairs(service.to_dict())
    elif action == "delete":
        _confirm_delete(args, services.get(args.id).name)
        services.delete(args.id)
        output.dump({"deleted": args.id}) if args.json else print(f"Deleted service {args.id}")
    else:
        created = services.create_token(args.id, args.token_name).to_dict()
        if args.json:
            output.dump(created)
        else:
            output.pairs(created)
            print("\nThe token is shown only now: send it as 'Authorization: Bearer <token>'.")


FOLLOW_SECONDS = 2.0


def _logs(args: argparse.Namespace, services) -> None:
    """Each replica's lines, prefixed with its id when there are several; with --follow,
    only what is new on each poll."""
    seen: dict[int, list[str]] = {}
    while True:
        replicas = [args.replica] if args.replica else [
            r.id for r in services.replicas(args.id) if r.state != "stopped"
        ]  # fmt: skip
        for replica_id in replicas:
            lines = services.replica_logs(args.id, replica_id, tail=args.tail)
            fresh = new_lines(seen.get(replica_id, []), lines)
            seen[replica_id] = lines
            prefix = "" if len(replicas) == 1 else f"[#{replica_id}] "
            for line in fresh:
                print(f"{prefix}{line}")
        if not args.follow:
            return
        sys.stdout.flush()
        try:
            _pause(FOLLOW_SECONDS)
        except KeyboardInterrupt:
            return


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def new_lines(before: list[str], now: list[str]) -> list[str]:
    """The lines of `now` after what `before` already showed: the longest end of
    `before` that starts `now` is the overlap (both are tails of the same log)."""
    for size in range(min(len(before), len(now)), 0, -1):
        if before[-size:] == now[:size]:
            return now[size:]
    return now


def _volume(text: str) -> dict:
    """NAME:/PATH (as `launch --volume`) as a service's mount: read-only unless ":rw",
    which the console refuses with its reason."""
    mount = parse_volume(text)
    return mount if text.endswith(":rw") else {"name": mount["name"], "path": mount["path"]}


def _autoscale(text: str) -> dict:
    """METRIC=TARGET, e.g. rps=5, as the API's {"metric", "target"}."""
    metric, sep, target = text.partition("=")
    try:
        value = float(target)
    except ValueError:
        value = -1.0
    if not sep or metric not in ("concurrency", "rps", "cpu", "gpu") or value <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give METRIC=TARGET with concurrency, rps, or cpu or gpu (percent, "
            "on a cluster) and a positive target"
        )
    return {"metric": metric, "target": int(value) if value.is_integer() else value}


def _confirm_delete(args: argparse.Namespace, name: str) -> None:
    """Deleting stops every replica and the endpoint: ask, unless --yes."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"delete service {name!r}: add --yes to confirm (no terminal to ask)")
    answer = input(f"Delete service {name!r} and its endpoint? Type its name to confirm: ")
    if answer.strip() != name:
        raise UsageError("not deleted: the name typed didn't match")
