"""Test-wide settings: hypothesis never times an example (a test must pass on a loaded machine;
speed targets live in benchmarks/)."""

from hypothesis import settings

settings.register_profile("simsp", deadline=None)
settings.load_profile("simsp")
