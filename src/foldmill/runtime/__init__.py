"""Runtime environment: devices, what the machine offers, shared settings."""
