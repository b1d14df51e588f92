"""Fault injection: the mutant catalogue, its runner and the import hook that serves a mutant."""
