from django.urls import path

from storage import views

app_name = "storage"

urlpatterns = [
    path("", views.volumes, name="volumes"),
    path("<int:volume_id>/", views.volume_detail, name="volume_detail"),
    path("<int:volume_id>/fill/cancel/", views.volume_fill_cancel, name="volume_fill_cancel"),
    path("<int:volume_id>/resize/", views.volume_resize, name="volume_resize"),
    path("<int:volume_id>/delete/", views.volume_delete, name="volume_delete"),
]
