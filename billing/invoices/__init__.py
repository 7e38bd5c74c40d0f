"""Invoices: drafts from the ledger, finalizing (gap-free numbers), adjustments, the PDF, and the
tenant's and staff's invoice pages. Rooms: services, selectors, views, forms, pdf.
"""
