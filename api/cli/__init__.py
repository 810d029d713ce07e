"""The `portkern` command line."""
