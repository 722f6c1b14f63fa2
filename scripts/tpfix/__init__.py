"""The tpfix distribution of vLLM: build, verify and maintain it."""
