from django.urls import path

from jobs import chaos_views, views

app_name = "jobs"

urlpatterns = [
    path("", views.job_list, name="list"),
    path("launch/", views.launch, name="launch"),
    path("launch/options/", views.launch_options, name="launch_options"),
    path("secrets/", views.secrets, name="secrets"),
    path("staff/fleet/", views.staff_fleet, name="staff_fleet"),
    path(
        "staff/suspect-nodes/<int:node_id>/healthy/",
        views.staff_node_healthy,
        name="staff_node_healthy",
    ),
    path("templates/<int:template_id>/delete/", views.template_delete, name="template_delete"),
    path("<int:job_id>/save-template/", views.template_save, name="template_save"),
    path("secrets/<int:secret_id>/delete/", views.secret_delete, name="secret_delete"),
    path("staff/sandbox/", chaos_views.staff_sandbox, name="staff_sandbox"),
    path(
        "staff/sandbox/pools/<int:pool_id>/reclaim/",
        chaos_views.staff_sandbox_reclaim,
        name="staff_sandbox_reclaim",
    ),
    path(
        "staff/sandbox/nodes/<str:node>/fail/",
        chaos_views.staff_sandbox_node_fail,
        name="staff_sandbox_node_fail",
    ),
    path(
        "staff/sandbox/nodes/<str:node>/xid-error/",
        chaos_views.staff_sandbox_node_xid,
        name="staff_sandbox_node_xid",
    ),
    path(
        "staff/sandbox/nodes/<str:node>/stuck-gpus/",
        chaos_views.staff_sandbox_node_stuck,
        name="staff_sandbox_node_stuck",
    ),
    path(
        "staff/sandbox/nodes/<str:node>/recover/",
        chaos_views.staff_sandbox_node_recover,
        name="staff_sandbox_node_recover",
    ),
    path(
        "staff/sandbox/api-faults/",
        chaos_views.staff_sandbox_api_faults,
        name="staff_sandbox_api_faults",
    ),
    path("<int:job_id>/", views.job_detail, name="detail"),
    path("<int:job_id>/delete/", views.job_delete, name="delete"),
    path("<int:job_id>/clone/", views.job_clone, name="clone"),
    path("<int:job_id>/<str:action>/", views.job_action, name="action"),
]
