from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from console import account_views, health, metrics, organisation_views, ssh_key_views, views
from environments import proxy as environment_proxy

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("accounts/login/", account_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/signup/", account_views.signup, name="signup"),
    path("accounts/signup/sent/", account_views.signup_sent, name="signup_sent"),
    path(
        "accounts/verify/<str:uidb64>/<str:token>/",
        account_views.signup_verify,
        name="signup_verify",
    ),
    path("accounts/password/", views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "accounts/password/reset/",
        account_views.PasswordResetView.as_view(),
        name="password_reset",
    ),
    path(
        "accounts/password/reset/sent/",
        auth_views.PasswordResetDoneView.as_view(
            template_name="registration/password_reset_done.html"
        ),
        name="password_reset_done",
    ),
    path(
        "accounts/password/reset/complete/",
        auth_views.PasswordResetCompleteView.as_view(
            template_name="registration/password_reset_complete.html"
        ),
        name="password_reset_complete",
    ),
    path(
        "accounts/password/reset/<str:uidb64>/<str:token>/",
        account_views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path("account/ssh-keys/", ssh_key_views.ssh_key_list, name="ssh_keys"),
    path(
        "account/ssh-keys/<int:key_id>/delete/",
        ssh_key_views.ssh_key_delete,
        name="ssh_key_delete",
    ),
    path("tenants/new/", views.tenant_create, name="tenant_create"),
    path("tenants/switch/", views.tenant_switch, name="tenant_switch"),
    path("members/", views.members, name="members"),
    path(
        "organisation/settings/",
        organisation_views.organisation_settings,
        name="organisation_settings",
    ),
    path("members/<int:membership_id>/role/", views.member_role, name="member_role"),
    path("members/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path(
        "invitations/<int:invitation_id>/revoke/", views.invitation_revoke, name="invitation_revoke"
    ),
    path("invitations/accept/<str:token>/", views.invitation_accept, name="invitation_accept"),
    path("tokens/", views.api_tokens, name="api_tokens"),
    path("tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
    path("audit/", views.audit_log, name="audit_log"),
    path("notifications/", views.notifications, name="notifications"),
    path("staff/tenants/", views.staff_tenants, name="staff_tenants"),
    path(
        "staff/tenants/<slug:tenant_slug>/", views.staff_tenant_detail, name="staff_tenant_detail"
    ),
    path(
        "staff/tenants/<slug:tenant_slug>/suspend/",
        views.staff_tenant_suspend,
        name="staff_tenant_suspend",
    ),
    path(
        "staff/tenants/<slug:tenant_slug>/reactivate/",
        views.staff_tenant_reactivate,
        name="staff_tenant_reactivate",
    ),
    path("marketplace/", include("marketplace.urls")),
    path("api/v1/", include("marketplace.api.urls")),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("storage.api.urls")),
    path("storage/", include("storage.urls")),
    path("api/v1/", include("services.api.urls")),
    path("jobs/", include("jobs.urls")),
    path("services/", include("services.urls")),
    path("api/v1/", include("environments.api.urls")),
    path("environments/", include("environments.urls")),
    # Jupyter of an environment, through the console (environments.proxy).
    re_path(
        r"^env/(?P<tenant_slug>[-\w]+)/(?P<name>[-a-z0-9]+)/(?P<path>.*)$",
        environment_proxy.jupyter_proxy,
        name="environment_jupyter",
    ),
    path("billing/", include("billing.urls")),
    path("api/v1/", include("billing.api.urls")),
    path("api/v1/", include("console.api.urls")),
    path("django-admin/", admin.site.urls),
]

handler400 = "console.errors.bad_request"
handler404 = "console.errors.page_not_found"
handler500 = "console.errors.server_error"
handler403 = "console.errors.permission_denied"
