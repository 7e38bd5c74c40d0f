"""`manage.py runconsole`: migrate, collect static files, seed demo data on first start,
run every process."""

import logging
import os

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connections
from django.test import override_settings

from console.host_access import host_isolation
from console.launcher import ConsoleLauncher, redacted_url
from console.metrics import multiprocess_dir_reset
from jobs.backends.kubernetes.sandbox import write_sandbox_files


class Command(BaseCommand):
    help = "Run the whole console (web, worker, beat, watcher; embedded Redis if needed)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--no-seed", action="store_true", help="Don't create demo data on first start."
        )
        parser.add_argument(
            "--worker-concurrency", type=int, default=int(os.environ.get("WORKER_CONCURRENCY", "2"))
        )

    def handle(self, *args, host, port, no_seed, worker_concurrency, **options):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher: %(message)s")
        launcher = ConsoleLauncher(
            base_dir=settings.BASE_DIR,
            data_dir=settings.DATA_DIR,
            host=host,
            port=port,
            worker_concurrency=worker_concurrency,
        )
        env = dict(os.environ)
        env["GPUGEEK_DATA_DIR"] = str(settings.DATA_DIR)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Its processes count /metrics together (console/metrics.py), from empty at each start.
        env["PROMETHEUS_MULTIPROC_DIR"] = str(
            multiprocess_dir_reset(
                env.get("PROMETHEUS_MULTIPROC_DIR") or settings.DATA_DIR / "prometheus"
            )
        )
        try:
            caches_here = settings.CACHES
            if not os.environ.get("REDIS_URL"):
                env["REDIS_URL"] = launcher.start_embedded_redis()
                # The URL carries the password (kept 0600 in the data dir): never printed.
                self.stdout.write(f"Embedded Redis at {redacted_url(env['REDIS_URL'])}")
                # This process's settings were read before that Redis existed: seeding
                # (which drops cached memberships) talks to it, not to no Redis at all.
                caches_here = {
                    "default": {**settings.CACHES["default"], "LOCATION": env["REDIS_URL"]}
                }
            with override_settings(CACHES=caches_here):
                call_command("migrate", interactive=False, verbosity=0)
                # Hashed, compressed static files (settings.STORAGES); seconds after the first.
                call_command("collectstatic", interactive=False, verbosity=0)
                if not settings.PRODUCTION and not no_seed:
                    call_command("seed_demo", if_empty=True)
            if settings.SANDBOX_CLUSTER:
                env.update(launcher.start_sandbox(write_sandbox_files))
                self.stdout.write(
                    f"Sandbox cluster (simulated GPU nodes) at {env['SANDBOX_URL']}; "
                    "nothing runs on real GPUs."
                )
            isolation = host_isolation()
            if isolation is not None:
                style = self.style.SUCCESS if isolation.isolated else self.style.WARNING
                self.stdout.write(style(isolation.note))
            connections.close_all()  # children open their own
        except BaseException:
            launcher.stop()
            raise
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104
        self.stdout.write(
            self.style.SUCCESS(
                f"GpuGeek console: http://{shown_host}:{port}/  (Ctrl-C stops everything)"
            )
        )
        raise SystemExit(launcher.run(env))
