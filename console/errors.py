"""Error pages: JSON under /api/, HTML elsewhere, never a stack trace."""

from django.views import defaults

from console.api.errors import json_error


def _wants_json(request) -> bool:
    return request.path.startswith("/api/")


def page_not_found(request, exception):
    if _wants_json(request):
        return json_error(404, "Not found.", "not_found")
    return defaults.page_not_found(request, exception, template_name="errors/404.html")


def permission_denied(request, exception):
    if _wants_json(request):
        return json_error(403, str(exception) or "Permission denied.", "permission_denied")
    return defaults.permission_denied(request, exception, template_name="errors/403.html")


def bad_request(request, exception):
    if _wants_json(request):
        return json_error(400, "Bad request.", "bad_request")
    return defaults.bad_request(request, exception)


def server_error(request):
    if _wants_json(request):
        return json_error(500, "Internal server error; it has been logged.", "server_error")
    return defaults.server_error(request, template_name="errors/500.html")
