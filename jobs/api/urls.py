from django.urls import path

from console.api.routers import OptionalSlashRouter
from jobs.api import chaos, checkpoint_events, log_stream, streams, views

router = OptionalSlashRouter()
router.register("jobs", views.JobViewSet, basename="api-job")
router.register("secrets", views.TenantSecretViewSet, basename="api-secret")

urlpatterns = [
    path(
        "jobs/<int:pk>/logs/stream",
        log_stream.JobLogStreamView.as_view(),
        name="api-job-log-stream",
    ),
    path("jobs/<int:pk>/metrics", streams.JobMetricsView.as_view(), name="api-job-metrics"),
    path(
        "jobs/<int:pk>/log.txt", streams.JobLogDownloadView.as_view(), name="api-job-log-download"
    ),
    path(
        "jobs/<int:pk>/checkpoint-events",
        checkpoint_events.CheckpointEventView.as_view(),
        name="api-job-checkpoint-events",
    ),
    path(
        "jobs/<int:pk>/checkpoint-credentials",
        checkpoint_events.CheckpointCredentialsView.as_view(),
        name="api-job-checkpoint-credentials",
    ),
    path("jobs/<int:pk>/monitor", streams.JobMonitorView.as_view(), name="api-job-monitor"),
    path("sandbox/nodes", chaos.SandboxNodesView.as_view(), name="api-sandbox-nodes"),
    path(
        "sandbox/pools/<slug:pool_slug>/reclaim-spot",
        chaos.SandboxReclaimSpotView.as_view(),
        name="api-sandbox-reclaim-spot",
    ),
    path(
        "sandbox/nodes/<str:node>/fail",
        chaos.SandboxNodeFailView.as_view(),
        name="api-sandbox-node-fail",
    ),
    path(
        "sandbox/nodes/<str:node>/recover",
        chaos.SandboxNodeRecoverView.as_view(),
        name="api-sandbox-node-recover",
    ),
    path(
        "sandbox/nodes/<str:node>/xid-error",
        chaos.SandboxNodeXidView.as_view(),
        name="api-sandbox-node-xid",
    ),
    path(
        "sandbox/nodes/<str:node>/stuck-gpus",
        chaos.SandboxNodeStuckView.as_view(),
        name="api-sandbox-node-stuck",
    ),
    path("sandbox/api-faults", chaos.SandboxApiFaultsView.as_view(), name="api-sandbox-faults"),
    *router.urls,
]
