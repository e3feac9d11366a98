"""User-facing adapters: the Keras callback, the custom-loop API, the session hook."""
