"""YAML configuration shared by the coordinator and the agent (site and federation files)."""

from cuvil_edge.config.federation import FederationConfig, load_federation
from cuvil_edge.config.site import SiteConfig, load_site

__all__ = ["FederationConfig", "SiteConfig", "load_federation", "load_site"]
