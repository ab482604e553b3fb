"""specreg.reports: the static HTML site built from every other part."""

from specreg.reports.site import build_site

__all__ = ["build_site"]
