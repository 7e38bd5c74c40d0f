from django.urls import path

from jobs import views

app_name = "jobs"

urlpatterns = [
    path("", views.job_list, name="list"),
    path("launch/", views.launch, name="launch"),
    path("launch/images/", views.image_options, name="image_options"),
    path("secrets/", views.secrets, name="secrets"),
    path("templates/<int:template_id>/delete/", views.template_delete, name="template_delete"),
    path("<int:job_id>/save-template/", views.template_save, name="template_save"),
    path("secrets/<int:secret_id>/delete/", views.secret_delete, name="secret_delete"),
    path("<int:job_id>/", views.job_detail, name="detail"),
    path("<int:job_id>/delete/", views.job_delete, name="delete"),
    path("<int:job_id>/<str:action>/", views.job_action, name="action"),
]
