"""Build host side: manifests, the bundle format and the builder. Needs no device runtime."""
