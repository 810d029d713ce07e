"""The base layer every other package builds on: typed errors, settings, signatures and
the checked container format of bundles and cache exports. Imports nothing else of portkern."""
