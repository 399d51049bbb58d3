"""Above every service: the CLI, the local stack, the process host (`--target` wiring)."""
