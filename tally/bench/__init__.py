"""`tally bench`: a load generator for any OpenAI-compatible server. Talks HTTP only; never
imports the engine (no torch), so it measures vLLM, SGLang or llama.cpp the same way."""
