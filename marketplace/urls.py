from django.urls import path

from marketplace.views import catalog, price_book, staff

app_name = "marketplace"

urlpatterns = [
    path("offers/", catalog.offers, name="offers"),
    path("estimate/", catalog.estimate, name="estimate"),
    path("recommend/", catalog.recommend, name="recommend"),
    path("images/", catalog.images, name="images"),
    path("images/<int:image_id>/retire/", catalog.image_deactivate, name="image_deactivate"),
    path(
        "images/registry-logins/<int:credential_id>/remove/",
        catalog.registry_credential_delete,
        name="registry_credential_delete",
    ),
    path("staff/prices/", price_book.staff_prices, name="staff_prices"),
    path(
        "staff/prices/<int:version_id>/",
        price_book.staff_price_version,
        name="staff_price_version",
    ),
    path("staff/catalog/", staff.staff_catalog, name="staff_catalog"),
    path(
        "staff/new-organisations/",
        staff.staff_new_tenant_policy,
        name="staff_new_tenant_policy",
    ),
    path(
        "staff/gpu-types/<slug:gpu_type_slug>/",
        staff.staff_gpu_type_edit,
        name="staff_gpu_type_edit",
    ),
    path("staff/pools/<int:pool_id>/", staff.staff_pool_edit, name="staff_pool_edit"),
    path("staff/registries/", staff.staff_registry_add, name="staff_registry_add"),
    path(
        "staff/registries/<int:registry_id>/remove/",
        staff.staff_registry_remove,
        name="staff_registry_remove",
    ),
    path("staff/images/", staff.staff_images, name="staff_images"),
    path(
        "staff/images/<int:image_id>/retire/", staff.staff_image_retire, name="staff_image_retire"
    ),
    path(
        "staff/tenants/<slug:tenant_slug>/commercials/",
        staff.staff_tenant_commercials,
        name="staff_tenant_commercials",
    ),
]
