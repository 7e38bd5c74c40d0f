from django.urls import path

from marketplace import views

app_name = "marketplace"

urlpatterns = [
    path("offers/", views.offers, name="offers"),
    path("estimate/", views.estimate, name="estimate"),
    path("images/", views.images, name="images"),
    path("images/<int:image_id>/retire/", views.image_deactivate, name="image_deactivate"),
    path(
        "images/registry-logins/<int:credential_id>/remove/",
        views.registry_credential_delete,
        name="registry_credential_delete",
    ),
    path("staff/prices/", views.staff_prices, name="staff_prices"),
    path("staff/prices/<int:version_id>/", views.staff_price_version, name="staff_price_version"),
    path("staff/catalog/", views.staff_catalog, name="staff_catalog"),
    path(
        "staff/gpu-types/<slug:gpu_type_slug>/",
        views.staff_gpu_type_edit,
        name="staff_gpu_type_edit",
    ),
    path("staff/pools/<int:pool_id>/", views.staff_pool_edit, name="staff_pool_edit"),
    path("staff/registries/", views.staff_registry_add, name="staff_registry_add"),
    path(
        "staff/registries/<int:registry_id>/remove/",
        views.staff_registry_remove,
        name="staff_registry_remove",
    ),
    path("staff/images/", views.staff_images, name="staff_images"),
    path(
        "staff/images/<int:image_id>/retire/", views.staff_image_retire, name="staff_image_retire"
    ),
    path(
        "staff/tenants/<slug:tenant_slug>/commercials/",
        views.staff_tenant_commercials,
        name="staff_tenant_commercials",
    ),
]
