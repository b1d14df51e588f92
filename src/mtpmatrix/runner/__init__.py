"""The nox side: rows, installs, the results store, bisect and the CI matrix. Runs outside a row's venv."""
