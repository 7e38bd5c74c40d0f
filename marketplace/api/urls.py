from django.urls import path

from console.api.routers import OptionalSlashRouter
from marketplace.api import views

router = OptionalSlashRouter()
router.register("gpu-types", views.GpuTypeViewSet, basename="api-gpu-type")
router.register("regions", views.RegionViewSet, basename="api-region")
router.register("offers", views.OfferViewSet, basename="api-offer")
router.register("images", views.ImageViewSet, basename="api-image")
router.register(
    "registry-credentials", views.RegistryCredentialViewSet, basename="api-registry-credential"
)
router.register("pools", views.NodePoolViewSet, basename="api-pool")
router.register("staff/pools", views.StaffNodePoolViewSet, basename="api-staff-pool")
router.register("price-versions", views.PriceVersionViewSet, basename="api-price-version")

urlpatterns = [
    path("estimates", views.EstimateView.as_view(), name="api-estimate"),
    path("recommendations", views.RecommendationView.as_view(), name="api-recommendation"),
    *router.urls,
]
