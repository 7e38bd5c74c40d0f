"""Error pages: JSON under /api/, HTML elsewhere, never a stack trace."""

from django.http import JsonResponse
from django.views import defaults


def _wants_json(request) -> bool:
    return request.path.startswith("/api/")


def page_not_found(request, exception):
    if _wants_json(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception, template_name="errors/404.html")


def permission_denied(request, exception):
    if _wants_json(request):
        return JsonResponse({"detail": str(exception) or "Permission denied."}, status=403)
    return defaults.permission_denied(request, exception, template_name="errors/403.html")


def server_error(request):
    if _wants_json(request):
        return JsonResponse({"detail": "Internal server error; it has been logged."}, status=500)
    return defaults.server_error(request, template_name="errors/500.html")
