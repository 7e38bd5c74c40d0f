"""The job pages: launch form (and its htmx image options), list with filters, detail with
timeline and actions, actions and delete by POST, roles and tenant scope.

Nothing runs here: dispatch happens after commit, which these (rolled-back) tests never
reach, so statuses are moved through the state machine by hand where a page needs one.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.text import Truncator

from console.models import AuditEvent
from jobs import services
from jobs.actors import BACKEND
from jobs.models import Job, JobStatus, LaunchTemplate
from jobs.services import JobSpec
from jobs.state import job_transition
from marketplace.models import NodePool
from tests.conftest import signed_in_client
from tests.factories import JobFactory
from tests.jobs_helpers import advance_to

LAUNCH = reverse("jobs:launch")
LIST = reverse("jobs:list")
LAUNCH_OPTIONS = reverse("jobs:launch_options")


@pytest.fixture
def member(world, catalog, settings):
    settings.COMPUTE_BACKENDS = ["local"]
    return signed_in_client(world.member, world.tenant)


@pytest.fixture
def viewer(world, catalog):
    return signed_in_client(world.viewer, world.tenant)


def form_data(**overrides) -> dict:
    data = {
        "name": "form job",
        "project": "",
        "gpu_type": "",
        "gpus_per_node": "0",
        "cpus": "1",
        "nodes": "1",
        "region": "local",
        "spot_ratio": "0",
        "image": "python-3.11",
        "command": "python -c 'print(42)'",
        "env": "",
        "secret_env": "",
        "priority": "normal",
        "max_runtime_minutes": "60",
        "checkpoint_path": "",
        "auto_release": "on",
    }
    data.update(overrides)
    return data


def make_job(world, name: str = "job", *path: str, tenant_world=None, **spec) -> Job:
    owner = tenant_world or world
    values = {"image": "python-3.11", "command": ["python", "-c", "pass"], "cpus": 1}
    values.update(spec)
    job = services.job_submit(
        tenant=owner.tenant, user=owner.member, spec=JobSpec(name=name, **values)
    )
    for to in path:
        job = job_transition(job=job, to=to, actor=BACKEND, reason=f"now {to}")
    return job


def detail_url(job: Job) -> str:
    return reverse("jobs:detail", args=[job.pk])


def action_url(job: Job, action: str) -> str:
    return reverse("jobs:action", args=[job.pk, action])


def text(response) -> str:
    return response.content.decode()


def local_cpu_vcpus() -> int:
    return NodePool.objects.get(backend="local", gpu_type=None, tier="on_demand").allocatable_vcpus


# --- launch ---------------------------------------------------------------------------------


def test_launch_form_renders_with_defaults(member):
    response = member.get(LAUNCH)
    assert response.status_code == 200
    page = text(response)
    assert 'id="launch-form"' in page
    assert '<option value="python-3.11" selected>' in page
    assert 'name="command"' in page and 'name="secret_env"' in page
    assert f'hx-get="{LAUNCH_OPTIONS}"' in page


@pytest.mark.parametrize(
    ("gpu_type", "offered", "not_offered"),
    [
        ("", {"python-3.11", "ubuntu-22-04"}, {"cuda-12-4-runtime", "rocm-6-2"}),
        ("h100-80gb", {"cuda-12-4-runtime", "python-3.11"}, {"rocm-6-2"}),
        ("mi300x", {"rocm-6-2"}, {"cuda-12-4-runtime", "tensorflow-2-17-gpu"}),
    ],
    ids=["cpu", "nvidia", "amd"],
)
def test_image_options_follow_the_hardware(member, settings, gpu_type, offered, not_offered):
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]  # the demo's GPU pools launchable
    response = member.get(
        LAUNCH_OPTIONS, {"gpu_type": gpu_type, "image": "python-3.11"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    page = text(response)
    assert "<html" not in page
    for slug in offered:
        assert f'value="{slug}"' in page, slug
    for slug in not_offered:
        assert f'value="{slug}"' not in page, slug
    if "python-3.11" in offered:
        assert '<option value="python-3.11" selected>' in page


def test_valid_launch_redirects_to_the_job(member, world):
    response = member.post(LAUNCH, form_data(env="BATCH=64\n# comment\n", secret_env="K=v"))
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == detail_url(job)
    assert (job.tenant, job.created_by, job.name) == (world.tenant, world.member, "form job")
    assert job.command == ["python", "-c", "print(42)"]
    assert job.env == {"BATCH": "64"} and job.secret_env_names == ["K"]
    assert job.status == JobStatus.DISPATCHING
    page = text(member.get(response["Location"]))
    assert "“form job” launched." in page


def test_shell_metacharacters_are_argv_not_a_shell(member):
    command = "echo $(touch pwned) ; ls | wc && rm -rf ~ `id` '>' out"
    response = member.post(LAUNCH, form_data(command=command))
    assert response.status_code == 302
    assert Job.objects.get().command == [
        "echo",
        "$(touch",
        "pwned)",
        ";",
        "ls",
        "|",
        "wc",
        "&&",
        "rm",
        "-rf",
        "~",
        "`id`",
        ">",
        "out",
    ]


def test_launch_over_capacity_queues_and_says_why(member, world):
    make_job(world, "filler", cpus=local_cpu_vcpus())
    response = member.post(LAUNCH, form_data(name="waiting"), follow=True)
    assert response.status_code == 200
    job = Job.objects.get(name="waiting")
    assert job.status == JobStatus.QUEUED
    page = text(response)
    assert "“waiting” is queued: waiting for 1 vCPUs" in page
    assert "Position 1 in the queue" in page


BAD_FORMS = {
    "unbalanced-quotes": ({"command": "python -c 'print(1)"}, "command", "Unbalanced quotes"),
    "blank-command": ({"command": "   "}, "command", ""),
    "no-name": ({"name": ""}, "name", ""),
    "unknown-image": ({"image": "no-such-image"}, "image", ""),
    "env-without-equals": ({"env": "JUSTANAME"}, "env", "write NAME=value"),
    "env-bad-name": ({"env": "1BAD=x"}, "env", "not a valid variable name"),
    "gpu-type-without-gpus": ({"gpu_type": "h100-80gb"}, "gpus_per_node", "at least one GPU"),
    "image-for-other-hardware": ({"image": "cuda-12-4-runtime"}, "image", "doesn't run on CPU"),
    "spot-over-one": ({"spot_ratio": "2"}, "spot_ratio", ""),
    "runtime-zero": ({"max_runtime_minutes": "0"}, "max_runtime_minutes", ""),
    "too-many-cpus": ({"cpus": "1024"}, "cpus", "vCPUs in all"),
    "cpus-on-a-cluster-without-it": ({"region": "us-west"}, "region", "No CPU pool in US West"),
    "gpu-memory-on-a-cpu-job": ({"gpu_memory_gib": "8"}, "gpu_memory_gib", "only for a GPU job"),
    "gpu-memory-zero": ({"gpu_memory_gib": "0"}, "gpu_memory_gib", ""),
}


@pytest.mark.parametrize(("overrides", "field", "message"), BAD_FORMS.values(), ids=BAD_FORMS)
def test_bad_launch_shows_form_errors(member, overrides, field, message):
    response = member.post(LAUNCH, form_data(**overrides))
    assert response.status_code == 200
    form = response.context["form"]
    assert field in form.errors, form.errors
    assert message in " ".join(form.errors[field])
    assert 'class="error"' in text(response) or "flash-error" in text(response)
    assert not Job.objects.exists()


def test_viewer_cannot_launch(viewer):
    assert viewer.get(LAUNCH).status_code == 403
    assert viewer.post(LAUNCH, form_data()).status_code == 403
    assert not Job.objects.exists()
    assert 'href="/jobs/launch/"' not in text(viewer.get(LIST))


def test_edit_and_relaunch_prefills_the_form(member, world):
    source = make_job(world, "source", command=["python", "-c", "print('a b')"], env={"A": "1"})
    Job.objects.filter(pk=source.pk).update(gpu_memory_gib=12)
    form = member.get(LAUNCH, {"from": source.pk}).context["form"]
    assert form.initial["name"] == "source (clone)"
    assert form.initial["gpu_memory_gib"] == 12
    assert form.initial["command"] == "python -c 'print('\"'\"'a b'\"'\"')'"
    assert form.initial["env"] == "A=1"


# --- list -------------------------------------------------------------------------------------


def test_list_filters_by_status_and_name(member, world, other_world):
    running = make_job(world, "train resnet", JobStatus.RUNNING)
    done = make_job(world, "eval resnet", JobStatus.RUNNING, JobStatus.SUCCEEDED)
    other = make_job(world, "preprocess", JobStatus.CANCELLED)
    make_job(world, "theirs resnet", tenant_world=other_world)

    def listed(**params) -> set[str]:
        response = member.get(LIST, params)
        assert response.status_code == 200
        return {row["job"]["name"] for row in response.context["rows"]}

    assert listed() == {running.name, done.name, other.name}
    assert listed(status="succeeded") == {done.name}
    assert listed(q="RESNET") == {running.name, done.name}
    assert listed(status="running", q="resnet") == {running.name}
    assert listed(status="not-a-status") == {running.name, done.name, other.name}
    assert "No job matches these filters." in text(member.get(LIST, {"q": "nothing"}))


def test_list_pages_fifty_newest_first_with_a_count(member, world, other_world):
    pool = NodePool.objects.get(backend="local", gpu_type=None, tier="on_demand")
    jobs = JobFactory.create_batch(52, tenant=world.tenant, pool=pool)
    JobFactory(tenant=other_world.tenant, pool=pool, name="theirs")

    def names(response) -> list[str]:
        assert response.status_code == 200
        return [row["job"]["name"] for row in response.context["rows"]]

    first = member.get(LIST)
    assert names(first) == [job.name for job in reversed(jobs[2:])]
    assert first.context["page"].paginator.count == 52
    assert names(member.get(LIST, {"page": 2})) == [jobs[1].name, jobs[0].name]
    past_the_end = member.get(LIST, {"page": 9})
    assert past_the_end.context["page"].number == 2 and len(names(past_the_end)) == 2
    assert names(member.get(LIST, {"status": "queued", "page": 2})) == [jobs[1].name, jobs[0].name]
    assert names(member.get(LIST, {"status": "running"})) == []


def test_list_rows_escape_what_users_typed(member, world):
    job = make_job(world, '<script>alert("n")</script>', project="p&'q")
    Job.objects.filter(pk=job.pk).update(status_reason='<img src=x onerror="r">')
    page = text(member.get(LIST))
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;n&quot;)&lt;/script&gt;" in page
    assert "p&amp;&#x27;q" in page
    assert "&lt;img src=x onerror=&quot;r&quot;&gt;" in page
    assert f'<tr data-job="{job.pk}"><td><a href="{detail_url(job)}">' in page


def test_list_rows_cut_long_reasons_as_truncatechars_does(member, world):
    long_reason = "x" * 58 + "yz" + "w" * 40
    job = make_job(world, "long")
    Job.objects.filter(pk=job.pk).update(status_reason=long_reason)
    page = text(member.get(LIST))
    assert Truncator(long_reason).chars(60) == "x" * 58 + "y…"
    assert '<span class="muted small">' + "x" * 58 + "y…</span>" in page


def test_list_table_is_an_htmx_partial(member, world):
    make_job(world, "one")
    response = member.get(LIST, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-table")
    page = text(response)
    assert page.lstrip().startswith('<section id="job-table"')
    assert "<html" not in page and "one" in page


def test_empty_list_invites_a_launch(member):
    page = text(member.get(LIST))
    assert "No jobs yet" in page and f'href="{LAUNCH}"' in page


def test_list_query_count_does_not_grow_with_jobs(member, world, django_assert_max_num_queries):
    make_job(world, "filler", cpus=local_cpu_vcpus() - 1)
    make_job(world, "first")
    make_job(world, "queued")
    advance_to(
        make_job(world, "running"), JobStatus.RUNNING
    )  # its cost is priced live: a query of its own
    member.get(LIST)
    with CaptureQueriesContext(connection) as few:
        assert member.get(LIST).status_code == 200
    few_jobs_queries = len(few)
    for n in range(30):
        job = make_job(world, f"bulk {n}")
        if n % 3 == 0:
            advance_to(job, JobStatus.RUNNING)
    with django_assert_max_num_queries(few_jobs_queries):
        rows = member.get(LIST).context["rows"]
    assert len(rows) == 34
    assert sum(row["job"]["status"] == JobStatus.RUNNING for row in rows) == 11


# --- detail ----------------------------------------------------------------------------------


def test_detail_shows_timeline_spec_and_actions(member, world):
    job = make_job(world, "train", JobStatus.RUNNING, secret_env={"HF_TOKEN": "hf_secret_value"})
    response = member.get(detail_url(job))
    assert response.status_code == 200
    page = text(response)
    assert '<h2 id="timeline-title">Timeline</h2>' in page
    assert [e.to_status for e in response.context["events"]] == [
        "queued",
        "dispatching",
        "running",
    ]
    assert "<strong>running</strong>" in page and "now running" in page
    assert 'data-testid="job-status">Running<' in page
    assert "HF_TOKEN=••••••" in page and "hf_secret_value" not in page
    for action in ("pause", "cancel"):
        assert f'action="{action_url(job, action)}"' in page, action
    assert f'href="{reverse("jobs:clone", args=[job.pk])}"' in page
    assert f'action="{action_url(job, "resume")}"' not in page
    assert reverse("jobs:delete", args=[job.pk]) not in page
    assert 'hx-trigger="every 2s' in page  # polling stays as the fallback to the socket


def test_detail_of_a_queued_and_of_a_finished_job(member, world):
    finished = make_job(world, "done", JobStatus.RUNNING, JobStatus.FAILED)
    make_job(world, "filler", cpus=local_cpu_vcpus())
    queued = make_job(world, "queued")
    page = text(member.get(detail_url(queued)))
    assert "Position 1 in the queue" in page and "waiting for 1 vCPUs" in page
    assert f'action="{action_url(queued, "pause")}"' not in page

    page = text(member.get(detail_url(finished)))
    assert reverse("jobs:delete", args=[finished.pk]) in page
    assert f'action="{action_url(finished, "cancel")}"' not in page
    assert 'hx-trigger="every 2s"' not in page  # nothing left to poll for


def test_detail_status_is_an_htmx_partial(member, world):
    job = make_job(world, "train", JobStatus.RUNNING)
    response = member.get(detail_url(job), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-status")
    page = text(response)
    assert page.lstrip().startswith('<div id="job-status"')
    assert "<html" not in page and "Specification" not in page


def test_viewer_sees_a_job_without_actions(viewer, world):
    job = make_job(world, "train", JobStatus.RUNNING)
    response = viewer.get(detail_url(job))
    assert response.status_code == 200
    assert "/pause/" not in text(response) and "/cancel/" not in text(response)
    assert viewer.post(action_url(job, "cancel")).status_code == 403
    assert viewer.get(reverse("jobs:delete", args=[job.pk])).status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


# --- actions and delete ------------------------------------------------------------------------


def test_actions_by_post(member, world):
    job = make_job(world, "train", JobStatus.RUNNING)
    response = member.post(action_url(job, "pause"), follow=True)
    assert response.redirect_chain == [(detail_url(job), 302)]
    assert "Pause requested for “train”." in text(response)
    job.refresh_from_db()
    assert job.status == JobStatus.PAUSING

    job_transition(job=job, to=JobStatus.PAUSED, actor=BACKEND, reason="stopped")
    member.post(action_url(job, "resume"))
    job.refresh_from_db()
    assert job.status == JobStatus.RESUMING

    member.post(action_url(job, "cancel"))
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLING  # until its backend reports the work ended
    page = text(member.get(detail_url(job)))
    assert "badge status status-cancelling" in page and ">Cancelling<" in page
    assert f'action="{action_url(job, "cancel")}"' not in page  # asked already


def test_refused_action_is_a_message_not_an_error(member, world):
    job = make_job(world, "done", JobStatus.RUNNING, JobStatus.SUCCEEDED)
    response = member.post(action_url(job, "resume"), follow=True)
    assert response.status_code == 200
    assert "Only a paused job can be resumed; this one is succeeded." in text(response)
    assert 'class="flash flash-error"' in text(response)


def test_action_needs_post_and_a_known_name(member, world):
    job = make_job(world, "train", JobStatus.RUNNING)
    assert member.get(action_url(job, "cancel")).status_code == 405
    assert member.post(action_url(job, "explode")).status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_htmx_action_answers_with_a_client_redirect(member, world):
    job = make_job(world, "train", JobStatus.RUNNING)
    response = member.post(action_url(job, "cancel"), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response["HX-Redirect"] == detail_url(job)


def test_clone_asks_first_saying_what_it_launches_then_opens_the_new_job(member, world):
    job = make_job(world, "train", JobStatus.RUNNING, JobStatus.FAILED)
    url = reverse("jobs:clone", args=[job.pk])

    confirm = member.get(url)

    assert confirm.status_code == 200
    assert not Job.objects.exclude(pk=job.pk).exists()  # asking launches nothing
    assert "Launch a clone of “train”?" in text(confirm)
    details = confirm.context["details"]
    assert details[0] == "1 node × 1 vCPU in This host"
    assert details[-1].startswith("About ") and "USD per hour while it runs" in details[-1]
    assert f'href="{reverse("jobs:launch")}?from={job.pk}">Edit first<' in text(confirm)

    response = member.post(url)
    clone = Job.objects.exclude(pk=job.pk).get()
    assert response["Location"] == detail_url(clone)
    assert clone.name == "train (clone)" and clone.command == job.command


def test_clone_of_another_tenants_job_is_404(member, world, other_world):
    foreign = make_job(world, "theirs", JobStatus.RUNNING, tenant_world=other_world)
    url = reverse("jobs:clone", args=[foreign.pk])
    assert member.get(url).status_code == 404
    assert member.post(url).status_code == 404
    assert Job.objects.count() == 1


def test_delete_asks_first_then_deletes_a_finished_job(member, world):
    job = make_job(world, "old", JobStatus.CANCELLED)
    url = reverse("jobs:delete", args=[job.pk])
    confirm = member.get(url)
    assert confirm.status_code == 200
    assert "Delete “old” and its timeline?" in text(confirm)
    assert Job.objects.filter(pk=job.pk).exists()

    response = member.post(url, follow=True)
    assert response.redirect_chain == [(LIST, 302)]
    assert "“old” deleted." in text(response)
    assert not Job.objects.filter(pk=job.pk).exists()


def test_delete_of_an_unfinished_job_is_refused(member, world):
    job = make_job(world, "live", JobStatus.RUNNING)
    response = member.post(reverse("jobs:delete", args=[job.pk]), follow=True)
    assert response.redirect_chain == [(detail_url(job), 302)]
    assert "Only a finished job can be deleted" in text(response)
    assert Job.objects.filter(pk=job.pk).exists()


def test_another_tenants_job_is_404(member, world, other_world):
    theirs = make_job(world, "theirs", JobStatus.CANCELLED, tenant_world=other_world)
    for response in (
        member.get(detail_url(theirs)),
        member.get(detail_url(theirs), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-status"),
        member.post(action_url(theirs, "clone")),
        member.post(action_url(theirs, "cancel")),
        member.get(reverse("jobs:delete", args=[theirs.pk])),
        member.post(reverse("jobs:delete", args=[theirs.pk])),
    ):
        assert response.status_code == 404
    assert Job.objects.count() == 1
    prefilled = member.get(LAUNCH, {"from": theirs.pk}).context["form"]
    assert prefilled.initial.get("name") is None


# --- launch defaults and templates --------------------------------------------------------


def test_launch_form_starts_in_the_default_region(member):
    form = member.get(LAUNCH).context["form"]
    assert form.initial["region"] == "local"  # the region of the configured CPU pool


def test_launch_from_a_template_prefills_the_form(member, world):
    source = make_job(world, "source", command=["python", "train.py"], env={"A": "1"})
    template = services.launch_template_save(job=source, name="nightly", user=world.member)

    form = member.get(LAUNCH, {"template": template.pk}).context["form"]

    assert (form.initial["name"], form.initial["command"]) == ("nightly", "python train.py")
    assert (form.initial["env"], form.initial["region"]) == ("A=1", "local")


def test_template_delete_asks_first_then_deletes_with_an_audit_record(member, world):
    source = make_job(world, "source")
    template = services.launch_template_save(job=source, name="nightly", user=world.member)
    url = reverse("jobs:template_delete", args=[template.pk])

    confirm = member.get(url)
    assert confirm.status_code == 200
    assert "Delete the launch template “nightly”?" in text(confirm)
    assert LaunchTemplate.objects.filter(pk=template.pk).exists()

    response = member.post(url, follow=True)
    assert response.redirect_chain == [(LAUNCH, 302)]
    assert "Template “nightly” deleted." in text(response)
    assert not LaunchTemplate.objects.filter(pk=template.pk).exists()
    event = AuditEvent.objects.get(action="launch_template.deleted")
    assert (event.tenant, event.actor) == (world.tenant, world.member)
    assert (event.target_id, event.metadata) == (str(template.pk), {"name": "nightly"})


# --- money, run time, simulated, human hardware names ----


def test_the_jobs_list_shows_run_time_money_gpu_names_and_simulated(
    member, world, catalog, settings
):
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]
    NodePool.objects.filter(backend="kubernetes").update(simulated=True)
    on_sandbox = make_job(world, "on-sandbox", image="cuda-12-4-runtime", region="us-west",
                          gpu_type="a100-80gb", gpus_per_node=8)  # fmt: skip
    started = timezone.now() - timedelta(hours=3, minutes=5)
    on_host = make_job(world, "on-host", region="local")
    advance_to(on_host, JobStatus.RUNNING, at=started)
    advance_to(on_host, JobStatus.SUCCEEDED, at=started + timedelta(hours=2, minutes=30))

    html = member.get(LIST).content.decode()
    rows = {
        name: row
        for name, row in re.findall(
            r'<tr data-job="\d+"><td><a href="[^"]+">([^<]+)</a>(.*?)</tr>', html, re.S
        )
    }
    assert "badge-simulated" in rows["on-sandbox"] and ">Simulated<" in rows["on-sandbox"]
    assert "badge-simulated" not in rows["on-host"]
    assert "8 × A100 80GB SXM" in rows["on-sandbox"] and "a100-80gb" not in rows["on-sandbox"]
    assert '<th scope="col" class="num">Run time</th>' in html
    assert 'data-testid="job-duration">2 h 30 min<' in rows["on-host"]
    assert 'data-testid="job-duration">—<' in rows["on-sandbox"]  # never ran
    # Money: two decimals and the currency.
    assert re.search(r'<td class="num">\d[\d,]*\.\d\d USD</td>$', rows["on-host"])
    assert "<td>This host</td>" in rows["on-host"]  # the region's name, not its slug
    assert on_sandbox.simulated is True


def test_a_finished_jobs_page_shows_its_cost_and_run_time_not_a_running_rate(
    member, world, catalog
):
    job = make_job(world, "done", region="local")
    started = timezone.now() - timedelta(minutes=50)
    advance_to(job, JobStatus.RUNNING, at=started)
    running = member.get(detail_url(job)).content.decode()
    assert "per hour while running" in running
    assert re.search(r'data-testid="job-rate">\d+\.\d\d USD per hour while running', running)
    assert re.search(r'data-testid="job-cost">\d+\.\d\d USD<', running)

    advance_to(job, JobStatus.CANCELLED, at=started + timedelta(minutes=12))
    html = member.get(detail_url(job)).content.decode()
    assert "per hour while running" not in html
    assert 'data-testid="job-run-time">Run time 12 min<' in html
    assert re.search(r'<span class="stat-label">Cost</span><span [^>]*data-testid="job-cost">'
                     r"\d+\.\d\d USD<", html)  # fmt: skip
