"""Everything that reaches into private TensorFlow / Keras internals, and nothing else.

Each module names the versions it was tested on and has a test under tests/ that fails
loudly when upstream changes. The rest of the package calls these through small APIs.
"""
