"""The device side: one thread owns the device and drives the plans of many requests."""
