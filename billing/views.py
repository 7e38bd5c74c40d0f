"""Cost Explorer pages. Thin: parse, call selectors, render."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing import charts, selectors
from billing.budgets.selectors import budget_statuses
from billing.forms import GROUP_BY_LABELS, GROUP_BY_NOUNS, CostFilterForm
from console.csv import csv_writer
from console.forms import add_service_error
from console.permissions import Capability, capability_required
from console.service_errors import ServiceError
from jobs.models import Job
from marketplace.selectors import gpu_type_colours, gpu_type_names


def _cost_query(request: HttpRequest) -> tuple[CostFilterForm, selectors.CostQuery | None]:
    form = CostFilterForm(
        request.GET or None, initial={"range": "this_month", "group_by": "gpu_type"}
    )
    data = form.cleaned_data if form.is_bound and form.is_valid() else {}
    if form.is_bound and not form.is_valid():
        return form, None
    try:
        start, end = selectors.date_range(
            data.get("range") or "this_month", start=data.get("start"), end=data.get("end")
        )
    except ServiceError as error:
        add_service_error(form, error)
        return form, None
    return form, selectors.CostQuery(
        start=start,
        end=end,
        group_by=data.get("group_by") or "gpu_type",
        gpu_type=data.get("gpu_type", ""),
        region=data.get("region", ""),
        tier=data.get("tier", ""),
        job_contains=data.get("job", ""),
    )


@capability_required(Capability.VIEW_TENANT)
def costs(request: HttpRequest) -> HttpResponse:
    form, query = _cost_query(request)
    context: dict = {"form": form, "query": query}
    if query is not None:
        tenant = request.tenant
        now = timezone.now()
        explorer = selectors.cost_explorer(tenant=tenant, query=query)
        rows, split, value, top = explorer.rows, explorer.split, explorer.value, explorer.top
        currency = rows[0]["currency"] if rows else "USD"
        mtd_days, cumulative = selectors.cumulative_month(tenant=tenant, now=now)
        statuses = budget_statuses(tenant=tenant, now=now)
        tenant_budget = next((s for s in statuses if not s.budget.project), None)
        month_end = (selectors.period_end(now) - timedelta(days=1)).date().isoformat()
        forecast = (
            tenant_budget.forecast
            if tenant_budget
            else selectors.forecast_month_end(
                jobs=Job.objects.for_tenant(tenant),
                spend=cumulative[-1] if cumulative else Decimal(0),
                now=now,
            )
        )
        # Groups by their display names: a GPU type's model, a tier's label.
        gpu_names = gpu_type_names()
        group_names = {"gpu_type": {**gpu_names, "cpu": "CPU"}, "tier": charts.TIER_LABELS}.get(
            query.group_by, {}
        )
        colours = gpu_type_colours()
        rows = [{**row, "label": group_names.get(row["key"], row["key"])} for row in rows]
        for entry in value:
            entry["gpu_type_name"] = gpu_names.get(entry["gpu_type"], entry["gpu_type"])
        context.update(
            {
                "group_label": GROUP_BY_LABELS[query.group_by],
                "group_noun": GROUP_BY_NOUNS[query.group_by],
                "rows": rows,
                "currency": currency,
                "total": sum((r["amount"] for r in rows), 0),
                "split": split,
                "value": value,
                "top": top,
                "statuses": statuses,
                "forecast": forecast,
                "figures": {
                    "daily": charts.daily_stacked(
                        explorer.days,
                        explorer.series,
                        currency,
                        names=group_names,
                        colours=colours if query.group_by == "gpu_type" else None,
                    ),
                    "mtd": charts.month_to_date(
                        mtd_days,
                        cumulative,
                        tenant_budget.budget.amount if tenant_budget else None,
                        forecast,
                        month_end,
                        currency,
                    ),
                    "tiers": charts.tier_share(split["by_tier"]),
                    "value": charts.value_bars(
                        value, currency, gpu_names=gpu_names, colours=colours
                    ),
                    "top": charts.top_jobs_bar(top, currency),
                },
                "export_query": request.GET.urlencode(),
            }
        )
    template = "billing/costs.html#explorer" if request.htmx else "billing/costs.html"
    return render(request, template, context)


@capability_required(Capability.VIEW_TENANT)
def costs_export(request: HttpRequest) -> HttpResponse:
    """CSV of exactly the grouped table the Cost Explorer shows for the same filters."""
    form, query = _cost_query(request)
    if query is None:
        errors = "; ".join(e for errs in form.errors.values() for e in errs)
        return HttpResponse(f"Bad filters: {errors}", status=400, content_type="text/plain")
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = (
        f'attachment; filename="costs-{query.start:%Y%m%d}-{query.end:%Y%m%d}-{query.group_by}.csv"'
    )
    # Names in `key` are the tenant's own text: csv_writer neutralises formulas. The
    # figures go in as Decimals, so a negative amount (a credit) stays a number.
    writer = csv_writer(response)
    writer.writerow([query.group_by, "gpu_hours", "vcpu_hours", "amount", "currency"])
    micro = Decimal("0.000001")
    for row in selectors.usage_rows(tenant=request.tenant, query=query):
        writer.writerow(
            [
                row["key"],
                (Decimal(row["gpu_seconds"]) / 3600).quantize(micro),
                (Decimal(row["cpu_seconds"]) / 3600).quantize(micro),
                Decimal(row["amount"]).quantize(micro),
                row["currency"],
            ]
        )
    return response
