from django.urls import path

from services import views

app_name = "services"

urlpatterns = [
    path("", views.service_list, name="list"),
    path("<int:service_id>/", views.service_detail, name="detail"),
    path("<int:service_id>/delete/", views.service_delete, name="delete"),
    path(
        "<int:service_id>/replicas/<int:replica_id>/logs/",
        views.replica_logs,
        name="replica_logs",
    ),
    path(
        "<int:service_id>/rollback/<int:revision_number>/",
        views.service_rollback,
        name="rollback",
    ),
    path(
        "<int:service_id>/tokens/<int:service_token_id>/revoke/",
        views.service_token_revoke,
        name="token_revoke",
    ),
]
