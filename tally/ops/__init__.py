"""Operations around a running server, over HTTP and Prometheus only (never the engine): alert rules from a
measured baseline, dashboards, and `tally route` with its canary releases. Works in front of any OpenAI-compatible
server; knows Tally's metrics best."""
