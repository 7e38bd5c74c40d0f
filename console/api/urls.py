from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from console.api import views
from console.api.routers import OptionalSlashRouter

router = OptionalSlashRouter()
router.register("tenants", views.TenantListView, basename="api-tenant")
router.register("members", views.MemberViewSet, basename="api-member")
router.register("invitations", views.InvitationViewSet, basename="api-invitation")
router.register("tokens", views.ApiTokenViewSet, basename="api-token")
router.register("ssh-keys", views.SshKeyViewSet, basename="api-ssh-key")
router.register("audit", views.AuditEventViewSet, basename="api-audit")
router.register("staff/tenants", views.StaffTenantViewSet, basename="api-staff-tenant")

urlpatterns = [
    path("auth/token", views.TokenLoginView.as_view(), name="api-auth-token"),
    path("me", views.MeView.as_view(), name="api-me"),
    path(
        "organisation/settings",
        views.OrganisationSettingsView.as_view(),
        name="api-organisation-settings",
    ),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "schema/swagger/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-swagger"
    ),
    path("schema/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    *router.urls,
]
