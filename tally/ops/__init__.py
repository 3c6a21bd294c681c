"""Operations around a running server, over HTTP and Prometheus only (never the engine): alert rules from a
measured baseline. Works in front of any OpenAI-compatible server; knows Tally's metrics best."""
