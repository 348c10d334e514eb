"""What every wing of the package shares. It imports nothing of the project outside itself."""
