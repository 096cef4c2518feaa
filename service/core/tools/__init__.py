"""Tools: definitions and their files, the registry, argument templates, execution.

Nothing is imported here, so that `service.core.turn` can use the definitions
without importing the executor (which depends on it).
"""
