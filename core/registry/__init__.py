"""OCI registries: the distribution-API client (`client`), and referrers kept only if about their subject."""
