"""A run: its state and event log, the runner, the agent loop and its turns, the context
window, the tool executor, policies, waits, subagents and what each call reports."""
