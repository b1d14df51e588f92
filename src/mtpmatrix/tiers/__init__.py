"""The row side: what runs inside a row's venv next to sglang -- the logic of each tier (smoke.py, gsm8k*.py), the
request families the smoke servers answer (surface/), the pytest plumbing (session/) and what differs between sglang
releases (compat/). The pairs (mtpmatrix.pairs) and the servers (mtpmatrix.serving) sit below it."""
