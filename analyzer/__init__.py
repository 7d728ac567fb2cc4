"""diagnose: names the bottleneck of an AI inference service."""
