"""The assembly: settings in, a running service out.

- `config`: `Settings`, the one place that reads the environment (and `agw.toml`);
- `app`: `App`, which builds the providers, agents, tools, state, the front door and
  the servers from the settings, and starts and stops them as one;
- `security`: the authenticator, the TLS material and the exposure check;
- `logs` and `telemetry`: logging and the OpenTelemetry SDK, set up once at start-up.

Nothing outside the assembly and the entry points (`service/__main__.py`,
`service/gateway/__main__.py`, `service/process/workers.py`) reads the settings.
"""
