"""The row side: what runs inside a row's venv next to sglang -- the pytest plugin, tiny and witness pairs,
sglang servers and their client, and the logic of each tier."""
