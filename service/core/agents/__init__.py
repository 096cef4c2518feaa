"""Agents: the file schema, the definition the service runs, the loader and its error
report, the registry of the watched `agents/` directory, and the skills."""
