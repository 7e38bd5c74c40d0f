from rest_framework.pagination import PageNumberPagination


class PageSizePagination(PageNumberPagination):
    """The one page envelope of every API list: {count, next, previous, results}."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
