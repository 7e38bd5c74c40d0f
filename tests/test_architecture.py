"""The code's shape, checked: dependencies point one way (console ← marketplace ← jobs ←
services ← billing), no module outside jobs/backends/ names a backend, modules stay small, and the
sandbox cluster (sandbox/) stands alone: plain Python, none of Django or the apps; and our own
imports sit at module level (only AppConfig.ready() and `if TYPE_CHECKING:` defer them);
no module of ours patches third-party code; serializers use the strict fields of
console.api.fields; only jobs/realtime/ talks to the channel layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.template import engines

from console.celery import app as celery_app
from console.service_errors import ErrorCode, ServiceError

ROOT = Path(__file__).resolve().parent.parent
# storage and services sit beside jobs, below billing: they may use jobs, jobs never
# uses them (services may mount storage's volumes; storage never uses services).
ORDER = ["console", "marketplace", "jobs", "storage", "services", "environments", "billing"]
# The project shell in console/ wires every room together and may name them all.
SHELL = {"console/urls.py", "console/routing.py", "console/asgi.py", "console/settings.py",
         "console/celery.py", "console/beat.py", "console/launcher.py",
         "console/management/commands/seed_demo.py",
         "console/management/commands/runconsole.py"}  # fmt: skip
MAX_LINES = 600
SANDBOX = "sandbox"


def app_modules(app: str):
    for path in sorted((ROOT / app).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if "/migrations/" not in relative:
            yield relative, path


def imported_roots(path: Path) -> set[str]:
    """Top-level packages a module imports, including imports inside functions."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("app", ORDER)
def test_dependencies_point_one_way(app):
    higher = set(ORDER[ORDER.index(app) + 1 :])
    offenders = {
        relative: sorted(imported_roots(path) & higher)
        for relative, path in app_modules(app)
        if relative not in SHELL and imported_roots(path) & higher
    }
    assert offenders == {}


BACKEND_NAME = re.compile(r"""["'](local|kubernetes)["']|hasattr\(\s*backend""")


def test_no_code_outside_the_backends_names_a_backend():
    # Where backend names are data: the choices of the pool model, the catalog's demo
    # rows and the setting that lists the installation's backends.
    allowed = {"marketplace/models.py", "marketplace/demo.py", "console/settings.py"}
    offenders = []
    for app in ORDER:
        for relative, path in app_modules(app):
            if relative.startswith("jobs/backends/") or relative in allowed:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if BACKEND_NAME.search(line.split("#")[0]):
                    offenders.append(f"{relative}:{number}: {line.strip()}")
    assert offenders == []


def test_application_modules_stay_small():
    long = {
        relative: count
        for app in [*ORDER, SANDBOX]
        for relative, path in app_modules(app)
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_sandbox_imports_neither_django_nor_the_apps_nor_the_tests():
    forbidden = {"django", *ORDER, "tests"}
    modules = list(app_modules(SANDBOX))
    assert modules, "sandbox/ has no modules"
    offenders = {
        relative: sorted(imported_roots(path) & forbidden)
        for relative, path in modules
        if imported_roots(path) & forbidden
    }
    assert offenders == {}


# --- imports of our own code sit at the top of the module ---------------------------------
OWN_PACKAGES = {*ORDER, SANDBOX, "tests", "gpugeek"}
LOCAL_IMPORT_ROOTS = [*ORDER, SANDBOX, "tests", "clients/python/src"]
# "path:qualified.function": why the import can't be at module level. Keep it empty or
# nearly so: a cycle is fixed by moving code or importing the module object, not here.
LOCAL_IMPORTS_ALLOWED: dict[str, str] = {}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_app_config(node: ast.ClassDef) -> bool:
    return any(
        getattr(base, "id", getattr(base, "attr", None)) == "AppConfig" for base in node.bases
    )


def _imports_own(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] in OWN_PACKAGES
    return any(alias.name.split(".")[0] in OWN_PACKAGES for alias in node.names)


def local_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, qualified function) of each import of our own code inside a function,
    except in an AppConfig's ready() and under `if TYPE_CHECKING:`."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, scope: tuple[str, ...], in_function: bool, exempt: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, (*scope, child.name), in_function, exempt)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                ready = (
                    child.name == "ready"
                    and isinstance(node, ast.ClassDef)
                    and _is_app_config(node)
                )
                visit(child, (*scope, child.name), True, exempt or ready)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                visit(ast.Module(body=child.orelse, type_ignores=[]), scope, in_function, exempt)
            elif isinstance(child, ast.Import | ast.ImportFrom):
                if in_function and not exempt and _imports_own(child):
                    found.append((child.lineno, ".".join(scope)))
            else:
                visit(child, scope, in_function, exempt)

    visit(tree, (), False, False)
    return found


def test_our_own_imports_are_at_module_level():
    offenders, allowed_seen = [], set()
    for root in LOCAL_IMPORT_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                continue
            for line, function in local_imports(ast.parse(path.read_text())):
                if f"{relative}:{function}" in LOCAL_IMPORTS_ALLOWED:
                    allowed_seen.add(f"{relative}:{function}")
                else:
                    offenders.append(f"{relative}:{line} (in {function})")
    assert not offenders, "imports of our code inside functions:\n" + "\n".join(offenders)
    assert allowed_seen == set(LOCAL_IMPORTS_ALLOWED), "stale LOCAL_IMPORTS_ALLOWED entries"


def imported_modules(path: Path) -> set[str]:
    """Dotted modules a module imports from (and those it imports whole)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def python_files():
    for app in (*ORDER, "tests"):
        yield from app_modules(app)


def test_queries_are_the_orm_s_not_compiled_beside_it():
    # Every read goes through the ORM (what every request asks is kept in Django's cache,
    # console.caching); no compiled-SQL cache beside it.
    assert not (ROOT / "console" / "compiled.py").exists()
    importers = {
        relative
        for relative, path in python_files()
        if any(module.startswith("console.compiled") for module in imported_modules(path))
    }
    assert importers == set()


HTML_BUILT_IN_PYTHON = re.compile(r"\b(mark_safe|format_html_join)\b")


def test_rows_are_written_by_templates_not_built_in_python():
    # A page's rows are template partials ({% partialdef %}, on the cached loader): HTML
    # strings marked safe in views or template tags escape nothing by themselves.
    offenders = [
        relative
        for app in ORDER
        for relative, path in app_modules(app)
        if re.search(r"(^|/)(views\.py|views/|templatetags/)", relative)
        and HTML_BUILT_IN_PYTHON.search(path.read_text())
    ]
    assert offenders == []


def test_templates_are_read_once_per_process():
    loaders = repr(engines["django"].engine.loaders)
    assert "django.template.loaders.cached.Loader" in loaders


# --- one dispatch path, tasks by object (issue 27) -----------------------------------------

_APPS = "|".join([*ORDER, SANDBOX])
DOTTED_TASK = re.compile(rf"""["'](?:{_APPS})\.tasks\.\w+["']""")
CELERY_CONFIGURATION = {"console/settings.py"}


def test_no_task_is_referenced_by_a_dotted_string():
    """Outside Celery's own configuration (the beat schedule), tasks are queued as task
    objects: "find usages" finds every sender, and a renamed task fails at import."""
    found = []
    for app in [*ORDER, SANDBOX]:
        for relative, path in app_modules(app):
            if relative in CELERY_CONFIGURATION:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if DOTTED_TASK.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []


def test_one_dispatch_task_and_no_dispatch_list_beside_celery():
    """Every admitted job is started by the one sweep over `dispatching` rows (the job row
    is the queue): no second dispatch task, no Redis list of dispatches of its own."""
    celery_app.loader.import_default_modules()
    dispatch_tasks = sorted(name for name in celery_app.tasks if "dispatch" in name)
    assert dispatch_tasks == ["jobs.tasks.jobs_dispatch_task"]
    for _, path in app_modules("jobs"):
        source = path.read_text()
        assert "rpush" not in source and "lrange" not in source, path


# Billing's parts are packages with the same rooms (billing/invoices/views.py), not flat
# modules named by prefix beside them (billing/invoice_views.py).
FLAT_ROOM = re.compile(r"^\w+_(views|selectors|forms|services|pdf|charts)\.py$")


def test_billing_has_no_flat_prefixed_modules():
    flat = sorted(p.name for p in (ROOT / "billing").glob("*.py") if FLAT_ROOM.match(p.name))
    assert flat == []


def _top_level_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]


def test_budgets_live_in_their_package():
    """Budgets are a room (billing/budgets/{services,selectors,views,forms}.py), not
    functions mixed into billing's Cost Explorer modules. billing/tasks.py keeps its
    budget task, whose name Celery knows."""
    rooms = {p.stem for p in (ROOT / "billing" / "budgets").glob("*.py")}
    assert {"services", "selectors", "views", "forms"} <= rooms
    strays = [
        f"{path.name}:{name}"
        for path in sorted((ROOT / "billing").glob("*.py"))
        if path.name != "tasks.py"
        for name in _top_level_names(path)
        if name.lower().startswith("budget")
    ]
    assert strays == []
    assert not (ROOT / "billing" / "services.py").exists()


def test_console_services_is_a_package_of_small_modules_that_reexports_nothing():
    """console/services/ holds a module for each thing it owns (audit, tokens, …); callers
    import the module they need, so its __init__ defines and imports nothing."""
    package = ROOT / "console" / "services"
    assert not (ROOT / "console" / "services.py").exists()
    init = ast.parse((package / "__init__.py").read_text())
    body = init.body[1:] if ast.get_docstring(init) is not None else init.body
    assert body == [], "console/services/__init__.py holds only a docstring"
    modules = sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
    assert len(modules) > 1
    too_long = [
        f"{p.name}: {count}"
        for p in modules
        if (count := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert too_long == []


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(tree))


def test_service_error_is_defined_once_with_an_enum_code():
    homes = [
        relative
        for app in ORDER
        for relative, path in app_modules(app)
        if _defines(path, "ServiceError")
    ]
    assert homes == ["console/service_errors.py"]
    assert ServiceError("x").code is ErrorCode.INVALID
    with pytest.raises(ValueError):
        ServiceError("x", code="nope")  # type: ignore[arg-type]


# --- serializers use the strict fields (console.api.fields) --------------------------------
DRF_LOOSE_FIELDS = {"CharField", "BooleanField", "EmailField", "SlugField", "URLField",
                    "RegexField", "IPAddressField", "NullBooleanField"}  # fmt: skip
DRF_MODEL_SERIALIZERS = {"ModelSerializer", "HyperlinkedModelSerializer"}
STRICT_FIELDS_MODULE = "console/api/fields.py"


def loose_serializer_uses(tree: ast.AST) -> list[int]:
    """Lines that make one of DRF's coercing text or boolean fields, or derive a model
    serializer from DRF's instead of console.api.fields.StrictModelSerializer."""
    modules, direct = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rest_framework"):
            for alias in node.names:
                if alias.name in ("serializers", "fields"):
                    modules.add(alias.asname or alias.name)
                else:
                    direct.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names
                        if alias.name.startswith("rest_framework")}  # fmt: skip

    def drf(node: ast.AST, names: set[str]) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr in names and ast.unparse(node.value) in modules
        return isinstance(node, ast.Name) and node.id in names and node.id in direct

    def loose(node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            return drf(node.func, DRF_LOOSE_FIELDS)
        return isinstance(node, ast.ClassDef) and any(
            drf(base, DRF_LOOSE_FIELDS | DRF_MODEL_SERIALIZERS) for base in node.bases
        )

    return [node.lineno for node in ast.walk(tree) if loose(node)]


def test_serializers_use_the_strict_fields():
    offenders = [
        f"{relative}:{line}"
        for app in ORDER
        for relative, path in app_modules(app)
        if relative != STRICT_FIELDS_MODULE
        for line in loose_serializer_uses(ast.parse(path.read_text()))
    ]
    assert offenders == []


# --- no patches of third-party code -----------------------------------------------------
def third_party_names(tree: ast.AST) -> set[str]:
    """Names a module binds by importing code that isn't ours (modules and their
    classes or functions: `serializers`, `Server`, `django`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in OWN_PACKAGES:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] not in OWN_PACKAGES
        ):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def third_party_patches(tree: ast.AST) -> list[int]:
    """Lines that set an attribute on an imported third-party module or class
    (`Server.handle_reply = …`, `setattr(serializers.CharField, …)`)."""
    imported = third_party_names(tree)
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            if _root_name(node.args[0]) in imported:
                lines.append(node.lineno)
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and _root_name(target) in imported:
                lines.append(node.lineno)
    return lines


def test_no_module_of_ours_patches_third_party_code():
    offenders = [
        f"{relative}:{line}"
        for app in [*ORDER, SANDBOX]
        for relative, path in app_modules(app)
        for line in third_party_patches(ast.parse(path.read_text()))
    ]
    assert offenders == []


# --- one realtime package -----------------------------------------------------------------
REALTIME_PACKAGE = "jobs/realtime/"


def _reaches_channel_layer(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.module == "channels.layers" or (
            node.module == "channels" and any(alias.name == "layers" for alias in node.names)
        )
    if isinstance(node, ast.Import):
        return any(alias.name.startswith("channels.layers") for alias in node.names)
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name == "get_channel_layer"


def channel_layer_uses(tree: ast.AST) -> list[int]:
    """Lines that reach the channel layer directly: importing `channels.layers` (or its
    names) or naming `get_channel_layer` (a consumer's `self.channel_layer` is fine)."""
    return [node.lineno for node in ast.walk(tree) if _reaches_channel_layer(node)]


def test_only_the_realtime_package_talks_to_the_channel_layer():
    offenders = [
        f"{relative}:{line}"
        for app in ORDER
        for relative, path in app_modules(app)
        if not relative.startswith(REALTIME_PACKAGE)
        for line in channel_layer_uses(ast.parse(path.read_text()))
    ]
    assert offenders == []


# --- services: a room beside jobs, reaching the host only through one interface -------------
SERVICES_ROOMS = {"models", "services", "selectors", "tasks", "gateway"}
# The one module of jobs/backends/ a service may use (the host jobs' sandbox and supervisor,
# behind a small interface); never a backend's job methods.
SERVICES_BACKEND_INTERFACE = "jobs.backends.host_processes"
# On a cluster, services use the Kubernetes backend (its client, names, namespace set-up),
# from their own package only.
SERVICES_CLUSTER_PACKAGE = "services/kubernetes/"
SERVICES_CLUSTER_INTERFACE = "jobs.backends.kubernetes"
# The backends' two outcomes of a failed call (retry later, or never), anywhere.
BACKEND_ERRORS = {"jobs.backends.BackendUnavailable", "jobs.backends.BackendRejected"}


def test_services_has_its_rooms_and_uses_the_host_through_one_interface():
    rooms = {p.stem for p in (ROOT / "services").glob("*.py")}
    assert rooms >= SERVICES_ROOMS
    assert (ROOT / "services" / "api" / "views.py").exists()
    offenders = {
        relative: sorted(
            module
            for module in imported_modules(path)
            if module.startswith("jobs.backends.")
            and not module.startswith(SERVICES_BACKEND_INTERFACE)
            and module not in BACKEND_ERRORS
            and not (
                relative.startswith(SERVICES_CLUSTER_PACKAGE)
                and module.startswith(SERVICES_CLUSTER_INTERFACE)
            )
        )
        for relative, path in app_modules("services")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
