"""Marketplace pages, by audience:

- `catalog`: what every signed-in member sees (offers, live estimate, image catalog and
  the tenant's private images and registry logins);
- `price_book`: the staff price book (dated price versions);
- `staff`: the rest of the staff pages (GPU types, pools, registry allow-list, public
  images, tenant pricing and quotas).

Views are thin: parse, check permission, call a service or selector, render.
"""
