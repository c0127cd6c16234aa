"""What every part of the service uses: the settings (config.py), the JSON errors (errors.py), the request deadline
(deadline.py), image limits and decoding (images.py, image_threads.py) and model loading (model_loading.py)."""
