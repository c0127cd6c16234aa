"""The device side: one thread owns the device and drives the plans of many requests (engine.py, the device
loop), with admission.py (which requests it takes; Retry-After), scheduler.py (what goes into each model call:
pure rules), device.py (the thread that runs the calls), watchdog.py, jobs.py and waiting.py (submit and wait), and
device_time.py (the device's busy and idle time when several server processes share it)."""
