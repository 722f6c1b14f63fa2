"""Scenario replays: real vLLM code of a patched tree on a simulated device layer."""
