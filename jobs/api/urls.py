from console.api.routers import OptionalSlashRouter
from jobs.api import views

router = OptionalSlashRouter()
router.register("jobs", views.JobViewSet, basename="api-job")

urlpatterns = router.urls
