"""The engine: offline LLM, step loop, model runner, async bridge for the server."""
