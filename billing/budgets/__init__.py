"""Budgets: monthly spend limits per tenant or project, their threshold alerts, the pause
of non-critical jobs at 100 % and the signed webhook. Rooms: services, selectors, views,
forms. The REST API is in billing/api/views.py, the tasks in billing/tasks.py.
"""
