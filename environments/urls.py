from django.urls import path

from environments import views

app_name = "environments"

urlpatterns = [
    path("", views.environment_list, name="list"),
    path("<slug:name>/", views.environment_detail, name="detail"),
    path("<slug:name>/start/", views.environment_start, name="start"),
    path("<slug:name>/stop/", views.environment_stop, name="stop"),
    path("<slug:name>/keep-alive/", views.environment_keep_alive, name="keep_alive"),
    path("<slug:name>/delete/", views.environment_delete, name="delete"),
]
