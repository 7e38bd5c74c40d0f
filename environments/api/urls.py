from console.api.routers import OptionalSlashRouter
from environments.api import views

router = OptionalSlashRouter()
router.register("environments", views.EnvironmentViewSet, basename="api-environment")

urlpatterns = router.urls
