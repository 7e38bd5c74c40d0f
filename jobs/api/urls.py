from django.urls import path

from console.api.routers import OptionalSlashRouter
from jobs.api import streams, views

router = OptionalSlashRouter()
router.register("jobs", views.JobViewSet, basename="api-job")
router.register("secrets", views.TenantSecretViewSet, basename="api-secret")

urlpatterns = [
    path("jobs/<int:pk>/metrics", streams.JobMetricsView.as_view(), name="api-job-metrics"),
    path(
        "jobs/<int:pk>/log.txt", streams.JobLogDownloadView.as_view(), name="api-job-log-download"
    ),
    path("jobs/<int:pk>/monitor", streams.JobMonitorView.as_view(), name="api-job-monitor"),
    *router.urls,
]
