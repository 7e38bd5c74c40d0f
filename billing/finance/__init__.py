"""The finance console: every tenant's invoices, revenue and ageing, staff's billing page of
a tenant. Rooms: selectors, revenue (revenue reads), views, forms, charts.
"""
