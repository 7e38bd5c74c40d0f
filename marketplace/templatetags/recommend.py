"""`{% recommend_panel "#launch-form" %}`: the GPU recommender's panel on any page, its
choice filling the GPU type, GPUs per node, nodes and region of the form named."""

from __future__ import annotations

from django import template

from marketplace.forms import RecommendForm

register = template.Library()


@register.inclusion_tag("marketplace/partials/recommend_card.html", takes_context=True)
def recommend_panel(context, fill_form: str = "", expanded: bool = False) -> dict:
    return {
        "request": context.get("request"),
        "recommend_form": RecommendForm(),
        "fill_form": fill_form,
        "expanded": expanded,
    }
