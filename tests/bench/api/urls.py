from django.urls import include, path

from tests.bench.api.baseline import BareDrfList, bare_json

urlpatterns = [
    path("bench/bare-json", bare_json),
    path("bench/bare-drf", BareDrfList.as_view()),
    path("", include("console.urls")),
]
