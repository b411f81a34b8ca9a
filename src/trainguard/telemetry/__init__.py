"""Thermal and power: per-host samplers, throughput against temperature, the power curve and model."""
