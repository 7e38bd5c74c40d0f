from django.urls import path

from billing import views

app_name = "billing"

urlpatterns = [
    path("costs/", views.costs, name="costs"),
    path("costs/export.csv", views.costs_export, name="costs_export"),
    path("budgets/", views.budgets, name="budgets"),
    path("budgets/<int:budget_id>/", views.budget_edit, name="budget_edit"),
    path("budgets/<int:budget_id>/delete/", views.budget_delete, name="budget_delete"),
    path(
        "budgets/<int:budget_id>/rotate-webhook-secret/",
        views.budget_rotate_webhook_secret,
        name="budget_rotate_webhook_secret",
    ),
]
