"""`gpugeek env …` (dev environments: list, get, create, start, stop, keep-alive, delete)
and `gpugeek ssh NAME` (OpenSSH through the console's gateway), over
`client.environments`."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys

from gpugeek import output
from gpugeek.client import Client
from gpugeek.errors import UsageError
from gpugeek.spec import parse_env

ENVIRONMENT_COLUMNS = ["name", "status", "region", "gpu_type", "gpus_per_node", "cpus",
                       "image", "home_volume", "last_activity_at"]  # fmt: skip


def add_parser(sub) -> None:
    env = sub.add_parser("env", help="dev environments (a box to work on over SSH)")
    actions = env.add_subparsers(dest="env_command", required=True, metavar="ACTION")
    actions.add_parser("list", help="list the organisation's environments")
    actions.add_parser("get", help="show the environment NAME").add_argument("name")
    create = actions.add_parser("create", help="create a stopped environment NAME")
    create.add_argument("name")
    create.add_argument("--region", required=True)
    create.add_argument("--image", required=True, help="catalog image slug")
    create.add_argument("--cpus", type=int)
    create.add_argument("--gpu-type", help="GPU type slug (omit for CPU only)")
    create.add_argument("--gpus", type=int, default=0, dest="gpus_per_node")
    create.add_argument(
        "--interactive", choices=["ssh", "jupyter", "both"], default="ssh",
        help="connect with SSH, Jupyter in the browser, or both (default: ssh)",
    )  # fmt: skip
    create.add_argument("--home-volume", help="an existing volume (default: NAME-home made)")
    create.add_argument("--home-gib", type=int, dest="home_volume_gib", help="its size if made")
    create.add_argument("--env", action="append", metavar="KEY=VALUE", default=[])
    create.add_argument("--secret", action="append", metavar="NAME", default=[])
    create.add_argument("--idle-minutes", type=int, help="stop after this long idle (60)")
    create.add_argument("--warning-minutes", type=int, help="warn this long before (10)")
    for name, text in (("start", "start it (a new job)"),
                       ("stop", "stop it (the home volume stays)")):  # fmt: skip
        one = actions.add_parser(name, help=text)
        one.add_argument("name")
        one.add_argument("--wait", action="store_true", help="until it runs / has stopped")
    keep = actions.add_parser("keep-alive", help="count as activity for the idle stop")
    keep.add_argument("name")
    keep.add_argument("--minutes", type=int, default=0, help="active until then (max a day)")
    delete = actions.add_parser("delete", help="delete a stopped environment NAME")
    delete.add_argument("name")
    volume = delete.add_mutually_exclusive_group(required=True)
    volume.add_argument("--keep-volume", action="store_true", help="its home volume stays")
    volume.add_argument("--delete-volume", action="store_true", help="its files go too")
    delete.add_argument("--yes", action="store_true", help="don't ask for confirmation")

    # Options before NAME, as ssh's own: `gpugeek ssh [-F FILE] [--print] NAME [-- COMMAND]`.
    ssh = sub.add_parser("ssh", help="ssh into the running environment NAME")
    ssh.add_argument("--print", action="store_true", help="print the ssh command, don't run it")
    ssh.add_argument("-F", dest="ssh_config", metavar="FILE", help="ssh's configuration file")
    ssh.add_argument("name")
    ssh.add_argument("argv", nargs="*", metavar="-- COMMAND", help="run this there")


def run(args: argparse.Namespace, client: Client) -> None:
    environments = client.environments
    action = args.env_command
    if action == "list":
        rows = [environment.to_dict() for environment in environments.list()]
        output.dump(rows) if args.json else output.table(rows, ENVIRONMENT_COLUMNS)
        return
    if action == "get":
        environment = environments.get(args.name)
    elif action == "create":
        policy = {"idle_minutes": args.idle_minutes, "warning_minutes": args.warning_minutes}
        environment = environments.create(
            args.name, region=args.region, image=args.image, cpus=args.cpus,
            gpu_type=args.gpu_type, gpus_per_node=args.gpus_per_node,
            interactive=args.interactive, home_volume=args.home_volume,
            home_volume_gib=args.home_volume_gib,
            env=parse_env(args.env) or None, secrets=args.secret or None,
            idle_policy={k: v for k, v in policy.items() if v is not None} or None,
        )  # fmt: skip
    elif action in ("start", "stop"):
        environment = getattr(environments, action)(args.name)
        if args.wait:
            wanted = ("running", "failed") if action == "start" else ("stopped", "failed")
            environment = environments.wait(args.name, statuses=wanted)
    elif action == "keep-alive":
        environment = environments.keep_alive(args.name, minutes=args.minutes)
    else:
        _confirm_delete(args)
        environments.delete(args.name, keep_volume=args.keep_volume)
        gone = {"deleted": args.name, "home_volume_kept": args.keep_volume}
        output.dump(gone) if args.json else print(f"Deleted environment {args.name}")
        return
    output.dump(environment.to_dict()) if args.json else output.pairs(environment.to_dict())


def _confirm_delete(args: argparse.Namespace) -> None:
    if args.yes or args.keep_volume:
        return  # nothing that can't be undone: the files stay
    if not sys.stdin.isatty():
        raise UsageError(
            f"delete environment {args.name!r} and its home volume: add --yes to confirm "
            "(no terminal to ask)"
        )
    answer = input(f"Delete {args.name!r} and every file on its home volume? Type its name: ")
    if answer.strip() != args.name:
        raise UsageError("not deleted: the name typed didn't match")


def ssh(args: argparse.Namespace, client: Client) -> None:
    """Run OpenSSH with the console's command for the environment (it replaces this
    process, so the terminal, exit code and signals are ssh's own)."""
    options = ["-F", args.ssh_config] if args.ssh_config else []
    argv = client.environments.ssh_argv(args.name, list(args.argv), options=options)
    if args.print:
        print(shlex.join(argv))
        return
    program = shutil.which(argv[0])
    if program is None:
        raise UsageError("ssh is not installed (OpenSSH's client, e.g. openssh-client)")
    client.close()
    sys.stdout.flush()
    os.execv(program, argv)  # noqa: S606 (ssh with the console's arguments, no shell)
