from django.urls import path

from billing.api import credit, invoices, views
from console.api.routers import OptionalSlashRouter

router = OptionalSlashRouter()
router.register("budgets", views.BudgetViewSet, basename="api-budget")
router.register("invoices", invoices.InvoiceViewSet, basename="api-invoice")

urlpatterns = [
    path("usage", views.UsageView.as_view(), name="api-usage"),
    path("costs/summary", views.CostSummaryView.as_view(), name="api-costs-summary"),
    path("credits", credit.CreditView.as_view(), name="api-credits"),
    *router.urls,
]
