"""The tiers' pytest plumbing: the plugin (tier gates, tiers.json), a tier forked into its own process, the
pytest process the runner starts, a record imported from a GPU box."""
