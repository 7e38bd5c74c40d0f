"""`gpugeek`: the command line. Exit codes (see EXIT_CODES) are stable for scripts."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpugeek import cli_environments, cli_services, config, output
from gpugeek import completion as completion_scripts
from gpugeek.client import Client
from gpugeek.cluster import Cluster
from gpugeek.errors import (
    AuthenticationError,
    BudgetExceeded,
    Conflict,
    ConnectionFailed,
    GpuGeekError,
    NotFound,
    QuotaExceeded,
    Timeout,
    UsageError,
    ValidationError,
)
from gpugeek.models import FINISHED_STATUSES
from gpugeek.spec import REQUIREMENT_VALUES, parse_env, parse_volume

OK, API_ERROR, USAGE, AUTH, NOT_FOUND, TIMEOUT, CONFLICT, LIMIT, UNREACHABLE = range(9)
EXIT_CODES = {
    OK: "success",
    API_ERROR: "the API refused the request (validation or other error)",
    USAGE: "bad command line or spec file",
    AUTH: "not logged in, invalid token, or not allowed (401/403)",
    NOT_FOUND: "no such job or object (404)",
    TIMEOUT: "a --wait/--timeout ran out",
    CONFLICT: "the job's state doesn't allow this (409)",
    LIMIT: "budget or quota exceeded (402)",
    UNREACHABLE: "the server could not be reached",
}
JOB_COLUMNS = ["id", "name", "status", "gpu_type", "nodes", "gpus_per_node", "region",
               "cost_to_date", "created_at"]  # fmt: skip
OFFER_COLUMNS = ["gpu_type", "region", "tier", "price_per_gpu_hour", "price_per_vcpu_hour",
                 "available_gpus", "total_gpus", "currency"]  # fmt: skip
BUDGET_COLUMNS = ["id", "name", "amount", "currency", "period", "thresholds", "action", "project"]
BUDGET_ACTIONS = {
    "pause": "pause_non_critical", "warn": "alert_only",
    "pause_non_critical": "pause_non_critical", "alert_only": "alert_only",
}  # fmt: skip
RECOMMEND_COLUMNS = ["gpu_type", "gpus", "nodes", "gpus_per_node", "region", "tier",
                     "price_per_hour", "currency", "fits", "available_now"]  # fmt: skip
WORKLOADS = ["pretrain", "full_finetune", "lora", "qlora", "inference"]
PRECISIONS = ["fp32", "bf16", "fp16", "int8", "int4"]
SIZE_SUFFIXES = {"t": 1000, "b": 1, "m": 0.001}
SSH_KEY_COLUMNS = ["id", "title", "type_label", "fingerprint", "created_at", "last_used_at"]
INVOICE_COLUMNS = ["number", "status", "period_start", "period_end", "total", "amount_due",
                   "currency"]  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpugeek",
        description="GpuGeek console from the command line.",
        epilog="Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()),
    )
    parser.add_argument("--url", help="console URL (else GPUGEEK_URL, else the stored login)")
    parser.add_argument("--token", help="API token (else GPUGEEK_TOKEN, else the stored login)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    login = sub.add_parser("login", help="store the URL and token in ~/.config/gpugeek")
    login.add_argument("--url", dest="login_url")
    login.add_argument("--token", dest="login_token", help="else read from stdin/prompt")

    offers = sub.add_parser("offers", help="list offers")
    offers.add_argument("--gpu-type")
    offers.add_argument("--region")
    offers.add_argument("--tier")
    offers.add_argument("--available", action="store_true", help="only with free capacity")
    offers.add_argument("--no-cpu", action="store_true", help="leave out CPU offers")

    estimate = sub.add_parser("estimate", help="price a job")
    _shape_args(estimate)
    estimate.add_argument("--hours", default="1")
    estimate.add_argument("--tier")

    recommend = sub.add_parser("recommend", help="GPUs for a model size and workload")
    recommend.add_argument("size", help="parameters: 7b, 70B, 1.5b, 350m, 1t (or 7 for 7B)")
    recommend.add_argument("--workload", choices=WORKLOADS, default="inference")
    recommend.add_argument("--precision", choices=PRECISIONS, default="bf16")
    recommend.add_argument("--sequence-length", type=int, help="tokens per sequence")
    recommend.add_argument("--batch-size", type=int)
    recommend.add_argument("--tier", choices=["on_demand", "spot", "reserved"])
    recommend.add_argument("--region")
    for name in ("--layers", "--hidden-size", "--kv-heads", "--head-dim", "--lora-rank"):
        recommend.add_argument(name, type=int, help="model shape (else derived from the size)")

    launch = sub.add_parser("launch", help="launch a job (flags or -f spec.yaml)")
    launch.add_argument("-f", "--file", help="spec file (YAML needs PyYAML; or JSON)")
    launch.add_argument("--name")
    launch.add_argument("--project")
    launch.add_argument("--image")
    _shape_args(launch)
    launch.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    launch.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="NAME:/PATH[:ro]",
        help="mount a volume (repeatable), e.g. data:/data or data:/data:ro",
    )
    launch.add_argument("--priority")
    launch.add_argument(
        "--gpu-memory-gib", type=int, help="GPU memory needed per GPU (pools keep a margin free)"
    )
    launch.add_argument(
        "--regions", metavar="A,B", help="several acceptable regions (not with --region): "
        "the cheapest wins, weighted by data locality",
    )  # fmt: skip
    launch.add_argument(
        "--gpu-types", metavar="A,B", help="several acceptable GPU types (not with --gpu-type)"
    )
    launch.add_argument("--data-region", help="where the job's data lives (without volumes)")
    launch.add_argument("--interconnect", choices=REQUIREMENT_VALUES["interconnect"],
                        help="require nodes with this interconnect")  # fmt: skip
    launch.add_argument("--cpu-arch", choices=REQUIREMENT_VALUES["cpu_arch"],
                        help="require nodes of this CPU architecture")  # fmt: skip
    launch.add_argument("--idempotency-key")
    launch.add_argument("--wait", action="store_true", help="wait until running")
    launch.add_argument("--timeout", type=float, default=600)
    launch.add_argument("argv", nargs="*", metavar="-- COMMAND", help="the job's command")

    ls = sub.add_parser("ls", help="list jobs")
    ls.add_argument("--status")

    for name, text in (("status", "show a job"), ("pause", "pause a job"),
                       ("resume", "resume a job"), ("cancel", "cancel a job")):  # fmt: skip
        one = sub.add_parser(name, help=text)
        one.add_argument("id", type=int)
    logs = sub.add_parser("logs", help="print a job's log")
    logs.add_argument("id", type=int)
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--since-line", type=int, default=0)
    logs.add_argument("--timeout", type=float)

    ssh_keys = sub.add_parser("ssh-keys", help="your SSH public keys (for dev environments)")
    ssh_sub = ssh_keys.add_subparsers(dest="ssh_keys_command", required=True, metavar="ACTION")
    ssh_sub.add_parser("list", help="list your SSH keys")
    ssh_add = ssh_sub.add_parser("add", help="add the public key in FILE (~/.ssh/id_ed25519.pub)")
    ssh_add.add_argument("file", help='a .pub file; "-" reads the key from stdin')
    ssh_add.add_argument("--title", default="", help="default: the key's comment")
    ssh_remove = ssh_sub.add_parser("remove", help="delete the SSH key ID")
    ssh_remove.add_argument("id", type=int)

    sub.add_parser("costs", help="cost summary")
    sub.add_parser("invoices", help="list invoices")
    sub.add_parser("budgets", help="list budgets")
    budget = sub.add_parser("budget", help="create, change or delete a budget")
    budget_sub = budget.add_subparsers(dest="budget_command", required=True, metavar="ACTION")
    budget_set = budget_sub.add_parser(
        "set", help="create the budget NAME, or change the options given of the one there is"
    )
    budget_set.add_argument("name")
    budget_set.add_argument("--amount", help="per period, e.g. 1500 (needed to create)")
    budget_set.add_argument("--period", choices=["monthly"])
    budget_set.add_argument(
        "--action", choices=list(BUDGET_ACTIONS), help="at 100 %%: pause non-critical jobs, "
        "or only warn (pause_non_critical and alert_only are the API's names)",
    )  # fmt: skip
    budget_set.add_argument(
        "--thresholds", metavar="PERCENTS", help="alert at these percents, e.g. 50,80,100"
    )
    budget_set.add_argument("--project", help='only this project\'s jobs ("" for all)')
    budget_set.add_argument("--webhook-url", help='POST alerts here (signed; "" for none)')
    budget_delete = budget_sub.add_parser("delete", help="delete the budget NAME")
    budget_delete.add_argument("name")

    cli_services.add_parser(sub)
    cli_environments.add_parser(sub)

    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=list(completion_scripts.SHELLS))
    return parser


def _shape_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-type", help='slug or name, e.g. "A100-80GB"')
    parser.add_argument("--count", type=int, help="total GPUs (split over nodes)")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--cpus", type=int)
    parser.add_argument("--region")
    parser.add_argument("--spot-ratio")


def _client(args) -> Client:
    stored = config.load()
    url = args.url or os.environ.get("GPUGEEK_URL") or stored.get("url")
    token = args.token or os.environ.get("GPUGEEK_TOKEN") or stored.get("token")
    if not token:
        raise AuthenticationError("Not logged in: run `gpugeek login` or set GPUGEEK_TOKEN.")
    return Client(url=url, token=token)


def _shape(args) -> dict[str, Any]:
    keys = ("gpu_type", "count", "nodes", "gpus_per_node", "cpus", "region", "spot_ratio")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def _load_spec(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error}") from None
    if path.endswith(".json"):
        try:
            spec = json.loads(text)
        except ValueError as error:
            raise UsageError(f"{path}: {error}") from None
    else:
        try:
            import yaml  # PyYAML is optional: only spec files need it
        except ImportError:
            raise UsageError(
                "reading a YAML spec needs PyYAML: pip install 'gpugeek[yaml]' (or use JSON)"
            ) from None
        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise UsageError(f"{path}: {error}") from None
    if not isinstance(spec, dict):
        raise UsageError(f"{path}: a spec is a mapping of fields")
    return spec


def _launch_spec(args) -> dict[str, Any]:
    spec = _load_spec(args.file) if args.file else {}
    spec.update(_shape(args))
    for key in ("name", "project", "image", "priority"):
        if getattr(args, key):
            spec[key] = getattr(args, key)
    if args.gpu_memory_gib is not None:
        spec["gpu_memory_gib"] = args.gpu_memory_gib
    for key in ("regions", "gpu_types"):
        if getattr(args, key):
            spec[key] = [part.strip() for part in getattr(args, key).split(",") if part.strip()]
    if args.data_region:
        spec["data_region"] = args.data_region
    requirements = {k: getattr(args, k) for k in REQUIREMENT_VALUES if getattr(args, k)}
    if requirements:
        spec["requirements"] = {**(spec.get("requirements") or {}), **requirements}
    if args.argv:
        spec["command"] = list(args.argv)
    if args.env:
        spec["env"] = {**(spec.get("env") or {}), **parse_env(args.env)}
    if args.volume:
        spec["volumes"] = [*(spec.get("volumes") or []), *map(parse_volume, args.volume)]
    if not spec.get("image") or not spec.get("command"):
        raise UsageError("launch needs an image and a command (flags or -f spec)")
    return spec


def _print_job(args, job) -> None:
    if args.json:
        output.dump(job.to_dict())
    else:
        output.pairs(_job_money(job.to_dict()))


def _job_money(row: dict) -> dict:
    """A job for people: its money as the console shows it (two decimals, the currency);
    `--json` keeps the API's full precision."""
    currency = row.get("currency") or ""
    for key in ("cost_to_date", "price_per_hour"):
        if key in row:
            row[key] = output.money(row[key], currency)
    return row


def _launch_notes(job) -> None:
    """What a launch costs and where it runs, in words, below its fields."""
    nodes = f"{job.spot_nodes} spot + {job.on_demand_nodes} on-demand node(s)"
    if job.price_per_hour is not None:
        price = output.money(job.price_per_hour, job.currency or "")
        print(f"Price: {price} per hour while running ({nodes})")
    if job.simulated:
        print(
            "Simulated: this job runs on the sandbox cluster's simulated nodes; "
            "its command is not executed."
        )


def _wait(cluster: Cluster, timeout: float, quiet: bool) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        status = cluster.refresh().status
        if status != last and not quiet:
            reason = cluster.job.status_reason
            print(f"job {cluster.id}: {status}" + (f" ({reason})" if reason else ""),
                  file=sys.stderr)  # fmt: skip
            last = status
        if status == "running":
            return
        if status in FINISHED_STATUSES:
            raise Conflict(f"job {cluster.id} finished as {status}", code="finished")
        if time.monotonic() >= deadline:
            raise Timeout(f"job {cluster.id} is {status} after {timeout:g}s")
        time.sleep(1)


def _percents(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(f"--thresholds {text!r}: whole percents, e.g. 50,80,100") from None


def _run(args) -> int:
    if args.command == "completion":
        print(completion_scripts.SHELLS[args.shell](_parser()), end="")
        return OK
    if args.command == "login":
        url = args.login_url or args.url or os.environ.get("GPUGEEK_URL") or "http://127.0.0.1:8000"
        token = args.login_token or args.token
        if not token:
            token = getpass.getpass("API token: ") if sys.stdin.isatty() else sys.stdin.readline()
        token = token.strip()
        if not token:
            raise UsageError("no token given")
        with Client(url=url, token=token) as client:
            me = client.me()
        path = config.save(url, token)
        if args.json:
            output.dump({"url": url, "config": str(path), "me": me})
        else:
            who = _who(me)
            print(f"Logged in to {url}{' as ' + who if who else ''}; saved to {path}")
        return OK
    with _client(args) as client:
        return _dispatch(args, client)


def _dispatch(args, client: Client) -> int:
    cmd = args.command
    if cmd == "offers":
        offers = client.list_offers(
            gpu_type=args.gpu_type, region=args.region, tier=args.tier,
            available=args.available or None, include_cpu=False if args.no_cpu else None,
        )  # fmt: skip
        rows = [o.to_dict() for o in offers]
        output.dump(rows) if args.json else output.table(rows, OFFER_COLUMNS)
    elif cmd == "estimate":
        request = _shape(args)
        request["hours"] = args.hours
        if args.tier:
            request["tier"] = args.tier
        if "region" not in request:
            raise UsageError("estimate needs --region")
        result = client.estimate(**request).to_dict()
        output.dump(result) if args.json else output.pairs(result)
    elif cmd == "recommend":
        _recommend(args, client)
    elif cmd == "launch":
        cluster = Cluster.create(
            _launch_spec(args), client=client, idempotency_key=args.idempotency_key
        )
        if args.wait:
            _wait(cluster, args.timeout, quiet=args.json)
        _print_job(args, cluster.job)
        if not args.json:
            _launch_notes(cluster.job)
    elif cmd == "ls":
        rows = [job.to_dict() for job in client.jobs(status=args.status)]
        output.dump(rows) if args.json else output.table(list(map(_job_money, rows)), JOB_COLUMNS)
    elif cmd == "status":
        _print_job(args, client.job(args.id))
    elif cmd in ("pause", "resume"):
        cluster = client.cluster(args.id)
        # The command answers at once with "pausing"/"queued"; `gpugeek status` follows.
        getattr(cluster, cmd)(wait=False)
        _print_job(args, cluster.job)
    elif cmd == "cancel":
        cluster = client.cluster(args.id).cancel()
        _print_job(args, cluster.job)
    elif cmd == "logs":
        cluster = client.cluster(args.id)
        for line in cluster.logs(follow=args.follow, since_line=args.since_line,
                                 timeout=args.timeout):  # fmt: skip
            if args.json:
                print(json.dumps(line.to_dict()), flush=True)
            else:
                print(line.text, flush=True)
    elif cmd == "costs":
        summary = client.cost_summary()
        output.dump(summary) if args.json else output.cost_summary(summary)
    elif cmd == "invoices":
        rows = [i.to_dict() for i in client.invoices()]
        output.dump(rows) if args.json else output.table(rows, INVOICE_COLUMNS)
    elif cmd == "budgets":
        rows = [b.to_dict() for b in client.budgets()]
        output.dump(rows) if args.json else output.table(rows, BUDGET_COLUMNS)
    elif cmd == "budget" and args.budget_command == "set":
        budget = client.set_budget(
            args.name, amount=args.amount, period=args.period,
            action=BUDGET_ACTIONS[args.action] if args.action else None,
            thresholds=_percents(args.thresholds), project=args.project,
            webhook_url=args.webhook_url,
        ).to_dict()  # fmt: skip
        output.dump(budget) if args.json else output.pairs(budget)
    elif cmd == "budget":
        client.delete_budget(args.name)
        output.dump({"deleted": args.name}) if args.json else print(f"Deleted {args.name!r}")
    elif cmd == "ssh-keys":
        _ssh_keys(args, client)
    elif cmd == "services":
        cli_services.run(args, client)
    elif cmd == "env":
        cli_environments.run(args, client)
    elif cmd == "ssh":
        cli_environments.ssh(args, client)
    return OK


def _ssh_keys(args, client: Client) -> None:
    if args.ssh_keys_command == "list":
        rows = [key.to_dict() for key in client.ssh_keys.list()]
        output.dump(rows) if args.json else output.table(rows, SSH_KEY_COLUMNS)
    elif args.ssh_keys_command == "add":
        try:
            path = Path(args.file).expanduser()
            text = sys.stdin.read() if args.file == "-" else path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"cannot read {args.file}: {error}") from None
        key = client.ssh_keys.add(text, title=args.title).to_dict()
        output.dump(key) if args.json else output.pairs(key)
    else:
        client.ssh_keys.delete(args.id)
        output.dump({"deleted": args.id}) if args.json else print(f"Deleted SSH key {args.id}")


def parameters_billion(size: str) -> str:
    """A size as the API's billions: 7b → 7, 350m → 0.35, 1.5T → 1500; a bare number is
    billions already."""
    text = size.strip().lower()
    factor = SIZE_SUFFIXES.get(text[-1:])
    number = text[:-1] if factor is not None else text
    try:
        value = float(number) * (factor or 1)
    except ValueError:
        raise UsageError(f"size {size!r}: a parameter count such as 7b, 350m or 70") from None
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _recommend(args, client: Client) -> None:
    shape = ("sequence_length", "batch_size", "tier", "region", "layers", "hidden_size",
             "kv_heads", "head_dim", "lora_rank")  # fmt: skip
    result = client.recommend(
        parameters_billion(args.size), workload=args.workload, precision=args.precision,
        **{k: getattr(args, k) for k in shape},
    )  # fmt: skip
    if args.json:
        output.dump(result.to_dict())
        return
    parts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in result.breakdown.items() if v)
    print(f"GPU memory needed: {result.memory_needed_gib} GiB ({parts})")
    print(f"With the {result.memory_margin:.0%} margin: {result.memory_with_margin_gib} GiB")
    output.table([o.to_dict() for o in result.options], RECOMMEND_COLUMNS)


def _who(me: Any) -> str:
    if not isinstance(me, dict):
        return ""
    user = me.get("user")
    return str(me.get("email") or (user.get("email") if isinstance(user, dict) else "") or "")


def exit_code(error: BaseException) -> int:
    if isinstance(error, UsageError):
        return USAGE
    if isinstance(error, AuthenticationError):
        return AUTH
    if isinstance(error, NotFound):
        return NOT_FOUND
    if isinstance(error, Timeout):
        return TIMEOUT
    if isinstance(error, Conflict):
        return CONFLICT
    if isinstance(error, BudgetExceeded | QuotaExceeded):
        return LIMIT
    if isinstance(error, ConnectionFailed):
        return UNREACHABLE
    return API_ERROR


def _json_after_the_command(parser: argparse.ArgumentParser) -> None:
    """`--json` also after the command (`gpugeek ls --json`), where scripts tend to put
    it; absent there, the value given before the command stands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.add_argument(
                    "--json",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help="machine-readable output",
                )
                _json_after_the_command(command)


def _stdout_closed() -> int:
    """The reader went away (`gpugeek ls | head`): stop quietly, as Unix tools do, and
    keep Python from complaining while it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    _json_after_the_command(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    try:
        return _run(args)
    except (GpuGeekError, UsageError) as error:
        code = exit_code(error)
        if args.json:
            body = {"error": type(error).__name__, "detail": str(error), "exit_code": code}
            if isinstance(error, GpuGeekError):
                body.update(code=error.code, status=error.status, errors=error.errors)
            print(json.dumps(body), file=sys.stderr)
        else:
            print(f"gpugeek: {type(error).__name__}: {error}", file=sys.stderr)
            if isinstance(error, ValidationError) and error.errors:
                for field, messages in error.errors.items():
                    print(f"  {field}: {' '.join(messages)}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_closed()


if __name__ == "__main__":
    sys.exit(main())
