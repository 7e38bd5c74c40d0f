from console.api.routers import OptionalSlashRouter
from storage.api import views

router = OptionalSlashRouter()
router.register("volumes", views.VolumeViewSet, basename="api-volume")

urlpatterns = router.urls
