from console.api.routers import OptionalSlashRouter
from services.api import views

router = OptionalSlashRouter()
router.register("services", views.ServiceViewSet, basename="api-service")

urlpatterns = router.urls
